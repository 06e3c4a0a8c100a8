#pragma once
// Encoders: one per wire format, each turning the choices' deltas (server/choice_output.h) into the bytes of
// a response, streamed (SSE events) or whole. GenerationJob drives them and knows no format; a new API is a
// new encoder. The OpenAI chat and completion encoders live here.

#include <memory>
#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/job_spec.h"

namespace moeserve::text {
class Tokenizer;
}

namespace moeserve::server {

// What every encoder reads: the request, the served model's name, the tokenizer (null: ids only) and the
// choices, which outlive the encoder.
struct EncoderContext {
  const JobSpec& spec;
  const std::string& model;
  const text::Tokenizer* tokenizer;
  const std::vector<ChoiceOutput>& choices;
};

class ResponseEncoder {
 public:
  virtual ~ResponseEncoder() = default;
  // Streaming: the events for one choice's delta ("" when there is nothing to send).
  virtual std::string delta(const ChoiceOutput& choice, const ChoiceDelta& d) = 0;
  // Streaming: what ends the stream once every choice finished; `error` is set when one failed.
  virtual std::string stream_end(const std::string& error) = 0;
  // Not streaming: the whole body (status 200).
  virtual std::string whole() = 0;
};

std::unique_ptr<ResponseEncoder> make_encoder(const EncoderContext& ctx);

// A token's text as logprobs show it ("token_id:N" where there is no tokenizer or the id has no text).
std::string token_text(const text::Tokenizer* tokenizer, int32_t id);
// Logprobs of tokens [from, to) of `entries` as the Chat API writes them (the Responses API's output_text
// too):
// [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}].
nlohmann::ordered_json token_logprobs(const text::Tokenizer* tokenizer,
                                      const std::vector<LogprobEntry>& entries, size_t from, size_t to);
// OpenAI's usage object over every choice (prompt tokens counted once per prompt).
nlohmann::ordered_json usage_json(const JobSpec& spec, const std::vector<ChoiceOutput>& choices);
// One SSE event: "data: <json>\n\n", invalid UTF-8 replaced.
std::string sse(const nlohmann::ordered_json& j);

}  // namespace moeserve::server
