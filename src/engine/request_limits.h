#pragma once
// The limits every generation request is held to, worded once. The engine checks them on submit (a caller
// that skipped them); the server checks them before a request reaches the engine and answers the client's 400
// with the same words (server/request_checks.h).

#include <cstdint>
#include <optional>
#include <string>

namespace moeserve {

// A prompt that leaves no token for the output, or a max_tokens that does not fit beside the prompt.
struct ContextOverflow {
  enum class Cause { kPrompt, kMaxTokens } cause;  // the parameter to change
  std::string message;
};

// nullopt when prompt_tokens + max_tokens (or the prompt and one output token) fit in max_model_len; a
// max_model_len of 0 or less is no limit (not known yet).
std::optional<ContextOverflow> context_overflow(int64_t prompt_tokens, std::optional<int> max_tokens,
                                                int64_t max_model_len);

// "token id N is outside the vocabulary (V tokens)"
std::string outside_vocabulary(int64_t id, int64_t vocab);

}  // namespace moeserve
