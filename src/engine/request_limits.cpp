#include "engine/request_limits.h"

#include <fmt/format.h>

namespace moeserve {

std::optional<ContextOverflow> context_overflow(int64_t prompt_tokens, std::optional<int> max_tokens,
                                                int64_t max_model_len) {
  if (max_model_len <= 0) return std::nullopt;
  if (prompt_tokens >= max_model_len) {
    return ContextOverflow{
        ContextOverflow::Cause::kPrompt,
        fmt::format("this model's maximum context length is {} tokens, but the prompt has {} "
                    "tokens (at least one token must be left for the output)",
                    max_model_len, prompt_tokens)};
  }
  if (max_tokens && prompt_tokens + *max_tokens > max_model_len) {
    return ContextOverflow{
        ContextOverflow::Cause::kMaxTokens,
        fmt::format("this model's maximum context length is {} tokens, but you requested {} "
                    "tokens ({} in the prompt, {} for the completion); reduce the prompt or "
                    "max_tokens",
                    max_model_len, prompt_tokens + *max_tokens, prompt_tokens, *max_tokens)};
  }
  return std::nullopt;
}

std::string outside_vocabulary(int64_t id, int64_t vocab) {
  return fmt::format("token id {} is outside the vocabulary ({} tokens)", id, vocab);
}

}  // namespace moeserve
