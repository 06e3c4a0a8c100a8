#pragma once
// Parsing and validation of OpenAI request bodies (/v1/completions, /v1/chat/completions) into typed
// requests. Everything a client can get wrong in a parameter this server knows is caught here and reported as
// ApiError 400 naming the parameter, the way the OpenAI API and vLLM do. Unknown parameters are accepted and
// ignored, as vLLM and SGLang do (SDKs and frameworks add new ones all the time); their names are returned
// for a debug log. Known parameters asking for something this server cannot do (vLLM's guided_grammar,
// non-text modalities other than images, JSON Schema keywords outside the supported subset) are rejected
// rather than ignored, since ignoring them would change what the client gets.

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace moeserve {
class JsonSchema;
}

namespace moeserve::server {

// Sampling and stopping, shared by both endpoints. Field names follow the OpenAI/vLLM parameters.
struct SamplingSettings {
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;  // 0: off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::optional<uint64_t> seed;
  std::optional<int> max_tokens;  // nullopt: up to the context length
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit, in [-100, 100]
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  // The fields the request set itself; generation_config.json's defaults (server/sampling_defaults.h) fill
  // the others.
  struct {
    bool temperature = false, top_p = false, top_k = false, min_p = false, repetition_penalty = false;
  } given;
};

// response_format: free text, any JSON object, or JSON that validates against a schema (compiled here, so a
// schema outside the supported subset is a 400 naming the keyword).
struct ResponseFormat {
  // kRegex: not JSON, text that matches a regex or is one of a choice (vLLM's structured_outputs, SGLang's
  // regex).
  enum class Type { kText, kJsonObject, kJsonSchema, kRegex } type = Type::kText;
  std::string name;                          // json_schema.name
  std::shared_ptr<const JsonSchema> schema;  // null for text
};

struct StreamSettings {
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats (vLLM): usage on every chunk
};

// An image of a request: its URL (data:, http:, https:) and the parameter path naming it in errors
// ("messages[1].content[0].image_url").
struct ImagePart {
  std::string url;
  std::string param;
};

// vLLM's per-request mm_processor_kwargs: this request's image resize bounds (pixel counts, smart_resize's
// min_pixels and max_pixels) over the server's; OpenAiService holds each within the server's own bounds.
struct ImageResize {
  std::optional<int64_t> min_pixels, max_pixels;
};

// A completions prompt: text to tokenize, or token ids as given.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::optional<std::string> model;
  std::vector<Prompt> prompts;    // a batch; each gets n choices, indexed prompt * n + i
  std::vector<ImagePart> images;  // image_data (SGLang's extension): the single prompt's images
  ImageResize mm_processor_kwargs;
  int n = 1;
  bool echo = false;
  std::optional<int> logprobs;         // number of top alternatives per token (0..20); nullopt: none
  bool return_token_ids = false;       // vLLM extension: token ids in choices (useful without a tokenizer)
  std::optional<int> prompt_logprobs;  // vLLM extension; also implied by echo + logprobs
  SamplingSettings sampling;
  ResponseFormat response_format;
  StreamSettings stream;
  std::string user;
  int priority = 0;                  // vLLM extension: smaller is served first by the engine
  std::vector<std::string> ignored;  // unknown parameters, as dotted paths ("stream_options.x")
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatRequest {
  std::optional<std::string> model;
  // Validated array of message objects, content normalised to a string or null, or (with images) an array of
  // {"type": "text", "text"} and {"type": "image"} parts.
  nlohmann::ordered_json messages;
  std::vector<ImagePart> images;  // the image_url parts in prompt order
  ImageResize mm_processor_kwargs;
  nlohmann::ordered_json tools;  // validated array of {"type":"function","function":{...}}, or empty array
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  int n = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  bool parallel_tool_calls = true;  // false: at most one tool call per choice
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool return_token_ids = false;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  SamplingSettings sampling;
  ResponseFormat response_format;
  StreamSettings stream;
  std::string user;
  int priority = 0;
  std::vector<std::string> ignored;
};

// Throw ApiError (400) on invalid JSON, wrong types, out-of-range values and unsupported requests.
CompletionRequest parse_completion_request(std::string_view body);
ChatRequest parse_chat_request(std::string_view body);

// A value for an error message: scalars as JSON cut to a few dozen bytes, arrays and objects by their type
// only, so that an error never echoes a large or deeply nested part of the request.
std::string brief(const nlohmann::ordered_json& v);

// The JSON body as an object (keys in the client's order, which templates render tools in), or ApiError 400
// that says what is wrong with it.
nlohmann::ordered_json parse_json_object(std::string_view body);

}  // namespace moeserve::server
