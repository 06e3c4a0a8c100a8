#pragma once
// The per-request text pipeline of a streaming response, in the order the server needs it:
// generated ids -> IncrementalDetokenizer -> StopStringFilter -> OutputParser -> OpenAI deltas.

#include <cstdint>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace moeserve::text {

class StreamingOutput {
 public:
  // stops: the request's stop strings; parser: reasoning/tool parsers (both may be off).
  StreamingOutput(const Tokenizer& tokenizer, std::vector<std::string> stops,
                  const OutputParserOptions& parser, bool skip_special_tokens = true);

  // One generated token; returns the delta to send (often empty). After a stop string completes,
  // stopped() is true, the delta holds the text before it, and the request should end.
  OutputDelta push(int32_t id);
  // End of generation (eos, length limit or stop): flushes everything held back.
  OutputDelta finish();

  bool stopped() const { return stop_.stopped(); }
  const std::string& matched_stop() const { return stop_.matched(); }
  // The whole message so far (complete after finish()).
  const ParsedOutput& message() const { return parser_.result(); }
  // All text after stop-string cutting, before parsing (for the legacy completions API).
  const std::string& text() const { return text_; }

 private:
  OutputDelta feed(const std::string& text);
  IncrementalDetokenizer detok_;
  StopStringFilter stop_;
  OutputParser parser_;
  std::string text_;
  bool finished_ = false;
};

}  // namespace moeserve::text
