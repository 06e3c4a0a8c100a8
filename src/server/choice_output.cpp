#include "server/choice_output.h"

namespace moeserve::server {

ChoiceOutput::ChoiceOutput(int index, int prompt_index, const text::Tokenizer* tokenizer,
                           text::StreamingOptions options, bool first_call_only)
    : index_(index),
      prompt_index_(prompt_index),
      output_(tokenizer, options),
      has_tool_parser_(options.parser && !options.parser->tool_parser.empty()),
      first_call_only_(first_call_only) {}

ChoiceDelta ChoiceOutput::push(const GenerateOutput& out) {
  ChoiceDelta d;
  if (finished_) return d;
  cached_tokens_ = std::max<int64_t>(cached_tokens_, out.usage.cached_tokens);
  if (!out.prompt_logprobs.empty()) prompt_logprobs_ = out.prompt_logprobs;

  d.tokens_from = tokens_.size();
  // Token by token, as plain decoding brings them: a step of speculative decoding brings several, and the
  // answer's text is put down to the tokens that wrote it, not to the whole step (which may also hold
  // reasoning or a call). Tokens past the one that completed a stop string are not part of the answer.
  for (size_t k = 0; k < out.tokens.size() && !output_.stopped(); ++k) {
    text::OutputDelta piece = output_.push(out.tokens[k]);
    tokens_.push_back(out.tokens[k]);
    if (k < out.logprobs.size()) logprobs_.push_back(out.logprobs[k]);
    if (!piece.content.empty()) content_from_last_token(d);
    text::append(d.text, std::move(piece));
  }
  d.tokens_to = tokens_.size();

  if (output_.stopped() || out.finished) {
    text::OutputDelta rest = output_.finish();
    if (!rest.content.empty() && d.new_tokens()) content_from_last_token(d);
    text::append(d.text, std::move(rest));
    finished_ = d.finished = true;
    settle(out);
  }
  if (first_call_only_) {
    std::erase_if(d.text.tool_calls, [](const text::ToolCallDelta& t) { return t.index > 0; });
  }
  return d;
}

void ChoiceOutput::content_from_last_token(ChoiceDelta& d) {
  const size_t k = tokens_.size() - 1;
  for (auto* spans : {&content_tokens_, &d.content_tokens}) {
    if (!spans->empty() && spans->back().second > k) continue;  // the flush at the end: counted already
    if (!spans->empty() && spans->back().second == k)
      spans->back().second = k + 1;
    else
      spans->emplace_back(k, k + 1);
  }
}

void ChoiceOutput::settle(const GenerateOutput& out) {
  if (first_call_only_) {
    first_call_message_ = output_.message();
    if (first_call_message_.tool_calls.size() > 1) first_call_message_.tool_calls.resize(1);
  }
  if (output_.stopped()) {
    finish_reason_ = "stop";
    stop_reason_ = output_.matched_stop();
  } else {
    finish_reason_ = to_string(out.finish_reason);
    if (out.stop_token) stop_reason_ = *out.stop_token;
    if (out.finish_reason == FinishReason::Error)
      error_ = out.error.empty() ? "generation failed" : out.error;
  }
  // A call the model ended itself: the client is to run the tools (a call cut by the length limit stays
  // "length", as in vLLM).
  if (finish_reason_ == "stop" && has_tool_parser_ && !message().tool_calls.empty())
    finish_reason_ = "tool_calls";
}

}  // namespace moeserve::server
