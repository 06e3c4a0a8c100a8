#include "server/request_checks.h"

#include <cctype>

#include "engine/request_limits.h"

namespace moeserve::server {

namespace {

// Compares in time independent of where the strings differ, so timing does not reveal a key's prefix (only
// its length, as with Python's hmac.compare_digest).
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool path_needs_api_key(std::string_view path) {
  if (path == "/v1/health") return false;
  return path.rfind("/v1/", 0) == 0 || path == "/generate" || path == "/tokenize" || path == "/detokenize" ||
         path == "/reset_prefix_cache" || path == "/flush_cache";
}

std::optional<ApiError> api_key_error(const HttpRequest& head, std::string_view key, bool cors_enabled) {
  if (key.empty() || !path_needs_api_key(head.path)) return std::nullopt;
  // A CORS preflight reveals nothing and runs nothing.
  if (head.method == "OPTIONS" && cors_enabled) return std::nullopt;
  std::string_view auth = head.header("authorization");
  // The scheme is case-insensitive (RFC 9110 section 11.1), the key is not.
  constexpr std::string_view kBearer = "bearer ";
  bool bearer = auth.size() > kBearer.size();
  for (size_t i = 0; bearer && i < kBearer.size(); ++i) {
    bearer = std::tolower(static_cast<unsigned char>(auth[i])) == kBearer[i];
  }
  if (bearer && same_secret(auth.substr(kBearer.size()), key)) return std::nullopt;
  std::string_view x_api_key = head.header("x-api-key");
  if (!x_api_key.empty() && same_secret(x_api_key, key)) return std::nullopt;
  return ApiError(401,
                  auth.empty() && x_api_key.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                                    : "incorrect API key provided",
                  "authentication_error", std::nullopt, "invalid_api_key");
}

void check_context_length(const ServedModel& model, size_t prompt_tokens, std::optional<int> max_tokens,
                          const char* prompt_param) {
  auto overflow = context_overflow(int64_t(prompt_tokens), max_tokens, model.max_model_len);
  if (!overflow) return;
  const char* param = overflow->cause == ContextOverflow::Cause::kPrompt ? prompt_param : "max_tokens";
  throw invalid_param(param, "{}", overflow->message);
}

void check_token_ids(const ServedModel& model, const char* param, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id >= model.vocab) throw invalid_param(param, "{}", outside_vocabulary(id, model.vocab));
  }
}

void check_sampling_token_ids(const ServedModel& model, const SamplingParams& params) {
  check_token_ids(model, "stop_token_ids", params.stop_token_ids);
  std::vector<int32_t> biased;
  for (auto [token, bias] : params.logit_bias) biased.push_back(token);
  check_token_ids(model, "logit_bias", biased);
}

void check_tokenizer(const ServedModel& model, const char* param) {
  if (!model.has_tokenizer) {
    throw invalid_param(param,
                        "this model has no tokenizer (no tokenizer.json), so it takes and gives token ids "
                        "only");
  }
}

void check_chat_template(const ServedModel& model) {
  check_tokenizer(model, "messages");
  if (!model.has_chat_template) {
    throw invalid_param("messages",
                        "this model has no chat template: render the prompt and send its token ids "
                        "to /v1/completions");
  }
}

void check_tool_calls(const ServedModel& model, bool tools_on) {
  if (tools_on && model.tool_call_parser.empty()) {
    throw invalid_param("tool_choice", "tool calls need the server to run with --tool-call-parser");
  }
}

}  // namespace moeserve::server
