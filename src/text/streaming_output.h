#pragma once
// The text half of one choice's output, in the order the server needs it:
// generated ids -> IncrementalDetokenizer -> StopStringFilter -> OutputParser -> deltas.
// The server's ChoiceOutput (server/choice_output.h) wraps it with token ids, logprobs and finish reasons.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace moeserve::text {

struct StreamingOptions {
  std::vector<std::string> stops;
  bool include_stop_str_in_output = false;  // vLLM: the matched stop string stays at the end of the text
  bool skip_special_tokens = true;
  // Reasoning/tool-call parsing (chat); without it all text is content.
  std::optional<OutputParserOptions> parser;
  // Text the server wrote into the assistant's turn (a forced tool call's opening): the client sees it as the
  // start of the output, so it is parsed before the first generated text.
  std::string assistant_prefix{};
};

// Appends `more` to `into`. A tool-call piece that continues the last piece's call (same index, no id) joins
// it, so one delta never carries two entries for one call.
void append(OutputDelta& into, OutputDelta more);

class StreamingOutput {
 public:
  // tokenizer null: token ids only, every delta is empty.
  StreamingOutput(const Tokenizer* tokenizer, StreamingOptions options);

  // One generated token; returns the delta to send (often empty). After a stop string completes,
  // stopped() is true, the delta holds the text before it, and the request should end.
  OutputDelta push(int32_t id);
  // End of generation (eos, length limit or stop): flushes everything held back.
  OutputDelta finish();

  bool stopped() const { return stop_ && stop_->stopped(); }
  const std::string& matched_stop() const;
  // The whole message so far (complete after finish()); without a parser, all text is content.
  const ParsedOutput& message() const;
  // All text after stop-string cutting, before parsing (the legacy completions API's text).
  const std::string& text() const { return text_; }

 private:
  OutputDelta feed(std::string text);
  std::optional<IncrementalDetokenizer> detok_;
  std::optional<StopStringFilter> stop_;
  std::optional<OutputParser> parser_;
  ParsedOutput unparsed_;  // message() without a parser
  std::string prefix_;     // assistant_prefix until the first feed
  bool include_stop_ = false;
  std::string text_;
  bool finished_ = false;
};

}  // namespace moeserve::text
