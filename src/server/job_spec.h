#pragma once
// What a generation request asks for once parsed and tokenized: the prompts, the engine parameters, and how
// its output is to be cut, parsed and written (JobSpec::Kind picks the wire format).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/generate_request.h"
#include "server/http.h"
#include "server/openai_request.h"
#include "text/output_parser.h"

namespace moeserve::server {

struct ResponsesRequest;
class ResponseStore;
class BackgroundResponse;

struct JobSpec {
  enum class Kind { kCompletion, kChat, kResponses, kMessages, kGenerate } kind = Kind::kCompletion;
  std::string id;  // cmpl-... / chatcmpl-... / resp_... / msg_... / generate-...
  int64_t created = 0;
  Clock::time_point arrival;
  std::chrono::milliseconds queue_timeout{0};

  std::vector<std::vector<int32_t>> prompts;   // one per prompt of a batch (chat: one)
  int64_t snapshot_hint = 0;                   // chat: where the generation prompt begins (GenerateRequest)
  std::shared_ptr<const PromptImages> images;  // chat: the prompt's images (null for text)
  std::vector<std::string> prompt_texts;       // for echo: the prompt as text
  int n = 1;
  SamplingParams params;  // per choice; choice i of a seeded request uses seed + i
  int priority = 0;       // engine priority of every choice (smaller first)
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  // What differs between the prompts of a batch with per-prompt sampling (SGLang's sampling_params list):
  // prompt i uses per_prompt[i] instead of params and the stop settings above. Empty: all use those.
  struct PromptSampling {
    SamplingParams params;
    std::vector<std::string> stop;
    bool include_stop_str_in_output = false;
    bool skip_special_tokens = true;
  };
  std::vector<PromptSampling> per_prompt;
  StreamSettings stream;
  bool echo = false;
  bool return_token_ids = false;
  // Completions: logprobs = number of alternatives; chat: logprobs flag + top_logprobs.
  std::optional<int> logprobs;
  // Chat: how each choice's text splits into reasoning, content and tool calls (null: all content).
  std::optional<text::OutputParserOptions> parser;
  bool parallel_tool_calls = true;  // false: a choice shows its first tool call only
  // Chat: text appended to the rendered prompt to force a tool call; it is part of the assistant's output
  // as the client sees it, so it goes through the parser before the generated text.
  std::string assistant_prefix;
  // Responses API: the request's echoed fields and conversation, and where the answer is kept.
  std::shared_ptr<const ResponsesRequest> responses;
  ResponseStore* response_store = nullptr;
  // A background response: where its events go (the encoder publishes each one), from its third on.
  std::shared_ptr<BackgroundResponse> background;
  GenerateOptions generate;  // kGenerate
};

}  // namespace moeserve::server
