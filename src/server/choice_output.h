#pragma once
// One choice's output pipeline, the same for every endpoint and for streaming or not: engine events ->
// token ids and logprobs -> text::StreamingOutput (detokenized text, stop strings cut, reasoning and
// tool-call deltas) -> what the encoders (server/encoders.h) write. It decides how the choice finished (the
// engine's reason, a stop string, or a tool call); it owns no threads and no engine request (GenerationJob
// does).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "text/streaming_output.h"

namespace moeserve::server {

// What one engine event added to a choice.
struct ChoiceDelta {
  text::OutputDelta text;                 // without an output parser, all new text is content
  size_t tokens_from = 0, tokens_to = 0;  // the new tokens: [from, to) of ChoiceOutput::tokens()/logprobs()
  std::vector<std::pair<size_t, size_t>> content_tokens;  // those of them that wrote some of d.text.content
  bool finished = false;                                  // this event ended the choice
  bool new_tokens() const { return tokens_to > tokens_from; }
};

class ChoiceOutput {
 public:
  // first_call_only: parallel_tool_calls false, so later calls are dropped.
  ChoiceOutput(int index, int prompt_index, const text::Tokenizer* tokenizer, text::StreamingOptions options,
               bool first_call_only = false);

  // Takes one engine event. Events after the choice finished (the engine's abort after a stop string) are
  // ignored and return an empty delta.
  ChoiceDelta push(const GenerateOutput& out);

  int index() const { return index_; }
  int prompt_index() const { return prompt_index_; }
  bool finished() const { return finished_; }
  // A stop string ended the choice while the engine still runs it: the caller cancels the engine request.
  bool cut_by_stop_string() const { return output_.stopped(); }
  const std::string& finish_reason() const { return finish_reason_; }
  // null, the stop string, or the stop token id that ended the choice (vLLM's stop_reason).
  const nlohmann::ordered_json& stop_reason() const { return stop_reason_; }
  const std::string& error() const { return error_; }  // finish_reason "error": what went wrong

  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<LogprobEntry>& logprobs() const { return logprobs_; }
  const std::vector<LogprobEntry>& prompt_logprobs() const { return prompt_logprobs_; }
  // The tokens of the answer's text (not reasoning, not tool calls): spans [from, to) of the tokens that
  // wrote some of it, what the Responses API's output_text logprobs cover.
  const std::vector<std::pair<size_t, size_t>>& content_tokens() const { return content_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  // The whole output: parsed message (chat) and the text after stop strings (completions).
  const text::ParsedOutput& message() const {
    return first_call_only_ ? first_call_message_ : output_.message();
  }
  const std::string& text() const { return output_.text(); }

 private:
  // The choice ended: its finish reason, stop reason and final message.
  void settle(const GenerateOutput& out);
  // The newest token wrote some of the answer's text: content_tokens_ and d's spans cover it.
  void content_from_last_token(ChoiceDelta& d);

  int index_;
  int prompt_index_;
  text::StreamingOutput output_;
  bool has_tool_parser_;
  bool first_call_only_;
  text::ParsedOutput first_call_message_;  // first_call_only: the message with its first call alone
  std::vector<int32_t> tokens_;
  std::vector<LogprobEntry> logprobs_;
  std::vector<LogprobEntry> prompt_logprobs_;
  std::vector<std::pair<size_t, size_t>> content_tokens_;
  int64_t cached_tokens_ = 0;
  bool finished_ = false;
  std::string finish_reason_;
  nlohmann::ordered_json stop_reason_;
  std::string error_;
};

}  // namespace moeserve::server
