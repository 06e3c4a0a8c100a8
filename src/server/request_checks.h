#pragma once
// The rules a request is held to that its JSON alone cannot decide (openai_request.h checks the shape while
// parsing, before any of these): the API key, the served model's limits (context length, vocabulary) and what
// the model can do (a tokenizer for text, a chat template for messages, a parser for tool calls). Each rule
// is written here once, with one message, and every path that applies it (chat completions, completions,
// responses, messages, tokenize) calls it here; the engine words its own check of the limits the same way
// (engine/request_limits.h).

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/http.h"

namespace moeserve::server {

// The paths behind the API key: the whole OpenAI API under /v1/ (unknown paths included, so they reveal
// nothing either), SGLang's /generate, and the tokenizer and cache endpoints; /health, /metrics and /version
// stay open.
bool path_needs_api_key(std::string_view path);

// nullopt when `head` may go on: no key configured, a path outside the key, a CORS preflight (when CORS is
// on: browsers send those without credentials), or the key as `Authorization: Bearer` or Anthropic's
// `x-api-key`. Otherwise the 401, decided from the head alone, before a body is read.
std::optional<ApiError> api_key_error(const HttpRequest& head, std::string_view key, bool cors_enabled);

// What the served model offers a request, as the service knows it at the time of the request.
struct ServedModel {
  int64_t max_model_len = 0;                            // 0: not known yet (loading): no context check
  int64_t vocab = std::numeric_limits<int64_t>::max();  // the smaller of the engine's and the tokenizer's
  bool has_tokenizer = false;
  bool has_chat_template = false;
  std::string tool_call_parser;  // "": tool calls are off
};

// A prompt of prompt_tokens plus max_tokens must fit in the context, with one token left for the output;
// prompt_param names the prompt ("prompt" or "messages").
void check_context_length(const ServedModel& model, size_t prompt_tokens, std::optional<int> max_tokens,
                          const char* prompt_param);

// Every token id a request names (prompt ids, stop_token_ids, logit_bias keys) is inside the vocabulary.
// Negative ids are refused while parsing.
void check_token_ids(const ServedModel& model, const char* param, const std::vector<int32_t>& ids);

// The same for the ids a request's sampling names: stop_token_ids and logit_bias's keys.
void check_sampling_token_ids(const ServedModel& model, const SamplingParams& params);

// Text in or out (a text prompt, stop strings, detokenizing, structured output, messages) needs the
// tokenizer.
void check_tokenizer(const ServedModel& model, const char* param);

// Messages (chat completions, responses, messages, tokenize) need the tokenizer and the chat template.
void check_chat_template(const ServedModel& model);

// tool_choice other than "none" needs the server's --tool-call-parser.
void check_tool_calls(const ServedModel& model, bool tools_on);

}  // namespace moeserve::server
