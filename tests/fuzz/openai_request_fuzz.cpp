// The OpenAI request parsers on one body, as both endpoints, as the Responses API's, as SGLang's /generate
// and as Anthropic's /v1/messages: each request is either
// a typed request whose fields hold what the parser promises, or an ApiError 400 with a short message.
// Anything else escaping (a nlohmann exception, a crash on deep nesting, a SchemaError) is a finding.
#include <set>
#include <string>

#include "engine/json_constraint.h"
#include "fuzz_target.h"
#include "server/api_error.h"
#include "server/generate_request.h"
#include "server/messages_request.h"
#include "server/openai_request.h"
#include "server/responses_request.h"

namespace moeserve::fuzz {

namespace {

using server::ApiError;

void check_refusal(const ApiError& e) {
  FUZZ_CHECK(e.status == 400, "a refused body answered {}, not 400: {}", e.status, e.what());
  check_error_message(e.what());
}

void check_sampling(const server::SamplingSettings& s) {
  FUZZ_CHECK(s.temperature >= 0 && s.temperature <= 2, "temperature {}", s.temperature);
  FUZZ_CHECK(s.top_p > 0 && s.top_p <= 1, "top_p {}", s.top_p);
  FUZZ_CHECK(s.top_k >= 0, "top_k {}", s.top_k);
  FUZZ_CHECK(!s.max_tokens || (*s.max_tokens >= 1 && s.min_tokens <= *s.max_tokens), "max_tokens/min_tokens");
  FUZZ_CHECK(s.stop.size() <= 64, "{} stop strings", s.stop.size());
  for (const auto& stop : s.stop) FUZZ_CHECK(!stop.empty(), "an empty stop string");
  for (const auto& [id, bias] : s.logit_bias)
    FUZZ_CHECK(id >= 0 && bias >= -100 && bias <= 100, "logit_bias");
}

// A schema the parser compiled drives a matcher; a fresh matcher must be able to start a value.
void check_schema(const server::ResponseFormat& f) {
  if (f.type == server::ResponseFormat::Type::kText) return;
  FUZZ_CHECK(f.schema != nullptr, "a JSON response_format without a schema");
  JsonMatcher matcher(f.schema);
  bool can_start = false;
  for (int c = 0; c < 256 && !can_start; ++c) can_start = matcher.accepts(std::string(1, char(c)));
  FUZZ_CHECK(can_start, "the compiled schema admits no first byte");
}

void check_chat(const server::ChatRequest& r) {
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};
  FUZZ_CHECK(r.messages.is_array() && !r.messages.empty(), "messages is not a non-empty array");
  for (const auto& m : r.messages) {
    FUZZ_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                   kRoles.count(m["role"].get<std::string>()),
               "a message without a normalised role");
    FUZZ_CHECK(m.contains("content") && (m["content"].is_string() || m["content"].is_null()),
               "a message whose content is neither a string nor null");
  }
  FUZZ_CHECK(r.tools.is_array(), "tools is not an array");
  FUZZ_CHECK(r.chat_template_kwargs.is_object(), "chat_template_kwargs is not an object");
  FUZZ_CHECK(r.n >= 1 && r.n <= 128, "n {}", r.n);
  FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= 20 && (r.logprobs || r.top_logprobs == 0),
             "top_logprobs");
  // What the chat template and the logs do with a request next: all of it must serialise.
  (void)r.messages.dump();
  (void)r.tools.dump();
  (void)r.chat_template_kwargs.dump();
  check_sampling(r.sampling);
  check_schema(r.response_format);
}

void check_completion(const server::CompletionRequest& r) {
  FUZZ_CHECK(!r.prompts.empty(), "no prompt");
  for (const auto& p : r.prompts) {
    if (const auto* text = std::get_if<std::string>(&p)) FUZZ_CHECK(!text->empty(), "an empty prompt");
    if (const auto* ids = std::get_if<std::vector<int32_t>>(&p)) {
      FUZZ_CHECK(!ids->empty(), "an empty token prompt");
      for (int32_t id : *ids) FUZZ_CHECK(id >= 0, "a negative token id");
    }
  }
  FUZZ_CHECK(r.n >= 1 && r.n <= 128, "n {}", r.n);
  FUZZ_CHECK(!r.logprobs || (*r.logprobs >= 0 && *r.logprobs <= 20), "logprobs");
  check_sampling(r.sampling);
  check_schema(r.response_format);
}

}  // namespace

Verdict fuzz_openai_request(std::string_view data) {
  Verdict verdict = Verdict::kRefused;
  try {
    check_chat(server::parse_chat_request(data));
    verdict = Verdict::kAccepted;
  } catch (const ApiError& e) {
    check_refusal(e);
  }
  try {
    check_completion(server::parse_completion_request(data));
    verdict = Verdict::kAccepted;
  } catch (const ApiError& e) {
    check_refusal(e);
  }
  try {
    const server::SglangGenerateRequest r = server::parse_generate_request(data);
    if (r.per_prompt.empty()) check_completion(r.completion);
    for (const auto& one : r.per_prompt) {
      check_completion(one);
      FUZZ_CHECK(one.prompts.size() == 1 && one.n == r.per_prompt[0].n, "per-prompt sampling_params");
    }
    FUZZ_CHECK(r.options.logprob_start_len >= -1, "logprob_start_len {}", r.options.logprob_start_len);
    verdict = Verdict::kAccepted;
  } catch (const ApiError& e) {
    check_refusal(e);
  }
  try {
    const server::ResponseStore store;  // empty: a previous_response_id is a 404
    const server::ResponsesRequest r = server::parse_responses_request(data, store);
    check_chat(r.chat);
    FUZZ_CHECK(!r.background || r.store, "a background response that is not stored");
    verdict = Verdict::kAccepted;
  } catch (const ApiError& e) {
    if (e.status != 404) check_refusal(e);
  }
  for (auto use : {server::MessagesBody::kCreate, server::MessagesBody::kCountTokens}) {
    try {
      check_chat(server::parse_messages_request(data, use));
      verdict = Verdict::kAccepted;
    } catch (const ApiError& e) {
      check_refusal(e);
    }
  }
  return verdict;
}

}  // namespace moeserve::fuzz
