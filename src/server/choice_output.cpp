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

  size_t taken = 0;
  d.text = output_.push(out.tokens, taken);
  d.tokens_from = tokens_.size();
  // Tokens past the one that completed a stop string are not part of the answer.
  tokens_.insert(tokens_.end(), out.tokens.begin(), out.tokens.begin() + std::ptrdiff_t(taken));
  for (size_t k = 0; k < taken && k < out.logprobs.size(); ++k) logprobs_.push_back(out.logprobs[k]);
  d.tokens_to = tokens_.size();

  if (output_.stopped() || out.finished) {
    text::append(d.text, output_.finish());
    finished_ = d.finished = true;
    settle(out);
  }
  if (first_call_only_) {
    std::erase_if(d.text.tool_calls, [](const text::ToolCallDelta& t) { return t.index > 0; });
  }
  if (!d.text.content.empty() && d.new_tokens()) {
    if (!content_tokens_.empty() && content_tokens_.back().second == d.tokens_from)
      content_tokens_.back().second = d.tokens_to;
    else
      content_tokens_.emplace_back(d.tokens_from, d.tokens_to);
  }
  return d;
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
