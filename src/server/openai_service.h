#pragma once
// The OpenAI-compatible API over one engine: routing, API-key auth, CORS, readiness and draining, the simple
// endpoints (/health, /ping, /v1/models, /get_model_info, /metrics, /version, /tokenize, /detokenize,
// /reset_prefix_cache, the stored responses of /v1/responses/{id}), and generation requests (/v1/completions,
// /v1/chat/completions, /v1/responses, /v1/messages, /health_generate) handed to GenerationJob, and
// Anthropic's token count (/v1/messages/count_tokens).

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "server/admission.h"
#include "server/background_runner.h"
#include "server/generation.h"
#include "server/http.h"
#include "server/image_input.h"
#include "server/openai_request.h"
#include "server/request_checks.h"
#include "server/responses_api.h"
#include "server/sampling_defaults.h"
#include "server/server_metrics.h"

namespace moeserve::text {
class ChatTemplate;
}

namespace moeserve::server {

struct ServiceOptions {
  std::string served_model_name = "moeserve";
  std::string model_path;  // "root" in /v1/models
  std::string api_key;     // empty: no auth (see api_key_from_environment)
  int64_t max_model_len = 0;
  std::chrono::milliseconds queue_timeout{std::chrono::seconds(60)};
  int default_completion_max_tokens = 16;  // /v1/completions without max_tokens, as in OpenAI and vLLM
  std::string version = "0.1.0";

  // Chat: the model's template (null: chat answers 400) and the output parsers ("" for none).
  std::shared_ptr<const text::ChatTemplate> chat_template;
  std::string reasoning_parser;  // "qwen3"
  std::string tool_call_parser;  // "qwen3_coder" or "hermes"
  // Requests' `priority` orders the engine's queue and preemption only when the operator asks for it
  // (otherwise any client could jump the queue); else it is accepted and ignored.
  bool enable_priority = false;
  // SGLang's direction (--enable-priority-scheduling without --schedule-low-priority-values-first): larger
  // values first. The engine serves smaller first, so the value is negated on the way in.
  bool priority_larger_first = false;
  // generation_config.json's sampling, for the fields a request leaves unset.
  SamplingDefaults sampling_defaults;
  // CORS (vLLM's --allowed-origins): browser origins allowed to call the API; "*" for any. Empty: no CORS
  // headers, and browsers keep other origins out.
  std::vector<std::string> allowed_origins;
  std::string tokenizer_path;  // /get_model_info
  bool vllm_metrics = false;   // /metrics also under vLLM's names (server/vllm_metrics.h)
  // SGLang's --incremental-streaming-output: /generate's streamed chunks carry only what is new.
  bool incremental_streaming_output = false;

  // Images (docs/vision.md): the image processor and the <|image_pad|> id when the engine has the vision
  // tower; without them an image is a 400 saying `images_off`.
  std::optional<ImageProcessorConfig> image_processor;
  int32_t image_token_id = -1;
  std::string images_off = "this model takes text only (its checkpoint has no vision tower)";
  ImageFetchOptions image_fetch;
  int max_images_per_prompt = 999;  // --limit-mm-per-prompt '{"image": N}' (vLLM's default)
  // Vision patches all of a request's images may hold (--max-image-patches-per-request), and never more
  // than the context's tokens hold (tokens x merge²): each image's share is known from its header, so one
  // over the rest is refused before its pixels are decoded. Each patch is 6 KB of pixel values (float32)
  // until the tower has encoded it: 262,144 patches (65,536 image tokens, four images at the release's
  // max_pixels) are 1.5 GB.
  int64_t max_image_patches_per_request = 262'144;
};

// serve's API key: the --api-key flag when given, else $MOESERVE_API_KEY, else $VLLM_API_KEY (so a vLLM
// deployment's environment works unchanged); `source` (optional) names where it came from, for the log.
std::string api_key_from_environment(const std::string& flag, std::string* source = nullptr);

// --allowed-origins as vLLM takes it (a JSON list, '["*"]') or a comma-separated list; "" gives none. Throws
// moeserve::Error on a malformed list.
std::vector<std::string> parse_allowed_origins(const std::string& flag);

class OpenAiService {
 public:
  // engine and tokenizer may be null (tests of routing and errors; a model without tokenizer.json).
  OpenAiService(ServiceOptions options, Engine* engine, const text::Tokenizer* tokenizer,
                Admission& admission, ServerMetrics& metrics);

  Reply handle(HttpRequest& request);  // the HttpServer handler
  // Installs this service's head check (the API key, decided before a body is read) and its choice of the
  // requests cheap enough to answer on the IO threads, so that /health answers while bodies are parsed.
  void configure(HttpServerOptions& http);
  // A 401 for a request without the right key on a path that needs it; nullopt when it may go on.
  std::optional<HttpResponse> check_head(const HttpRequest& head) const;
  // GETs (/health, /metrics, /v1/models, /version) and CORS preflights read no body and do no parsing: they
  // run inline. A stored response's GET writes out a response (or a page of items) that may be megabytes of
  // JSON: it runs on the request pool.
  static bool runs_inline(const HttpRequest& head) {
    return (head.method == "GET" && !head.path.starts_with("/v1/responses/")) || head.method == "OPTIONS";
  }

  void set_ready(bool ready) { ready_ = ready; }
  // Once loading finishes (before set_ready): the engine and the context length it settled on.
  void set_engine(Engine* engine, int64_t max_model_len);
  bool ready() const { return ready_ && !draining_; }

  // SIGTERM: /health turns 503 and new generation requests are refused; running ones continue.
  void begin_drain();
  // Generation requests not yet finished (queued or running).
  size_t in_flight();
  // Shutdown timeout reached: stop every generation; responses end with finish_reason "abort".
  void abort_all();

 private:
  Reply route(HttpRequest& request);
  void check_model(const std::optional<std::string>& model) const;
  void check_generation_ready() const;
  Reply completions(HttpRequest& request);
  Reply generate(HttpRequest& request);  // SGLang's /generate
  // A completion request's job (tokenized prompts, parameters); its id starts with id_prefix, and without a
  // max_tokens it generates up to default_max_tokens.
  JobSpec completion_job(CompletionRequest& request, JobSpec::Kind kind, const char* id_prefix,
                         int default_max_tokens);
  Reply chat_completions(HttpRequest& request);
  Reply responses(HttpRequest& request);
  Reply messages(HttpRequest& request);
  // A chat request's prompt, after the checks every chat path makes (model, template, tool parser): the
  // rendered text, the opening written to force a tool call (tool_choice "required" or a named function),
  // and the token ids of both, images expanded.
  struct ChatPrompt {
    std::string text, forced_prefix;
    std::vector<int32_t> ids;
    std::shared_ptr<const PromptImages> images;
  };
  ChatPrompt chat_prompt(const ChatRequest& request);
  // POST /v1/messages/count_tokens: the prompt tokens /v1/messages counts as usage.input_tokens.
  HttpResponse count_message_tokens(HttpRequest& request);
  // A chat request's job (tokenized prompt, parameters, parsers, constraint); its id starts with id_prefix.
  JobSpec chat_job(ChatRequest& request, const char* id_prefix);
  // A job of `kind` arriving now, its id `id_prefix` and a random part.
  JobSpec new_spec(JobSpec::Kind kind, const char* id_prefix) const;
  HttpResponse health() const;
  HttpResponse model_info() const;
  Reply health_generate();
  // CORS: the headers every answer to an allowed Origin carries, and the answer to a preflight.
  Headers cors_headers(const HttpRequest& request) const;
  std::optional<HttpResponse> preflight(const HttpRequest& request) const;
  HttpResponse models(const std::string& id) const;
  HttpResponse tokenize(const HttpRequest& request);
  HttpResponse detokenize(const HttpRequest& request);
  // A job admitted (429/503 when refused outright) and counted in flight.
  std::shared_ptr<GenerationJob> admitted_job(JobSpec spec);
  Reply start_job(JobSpec spec);
  // A Responses job with background: true, run by background_ with its state in the store; the reply is
  // the queued response, or with stream: true its event stream (which the client may leave).
  Reply start_background(JobSpec spec);
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens, const char* param) const;
  int64_t turn_boundary(const std::vector<int32_t>& prompt) const;
  // Logs each unknown request parameter's name once, at debug level.
  void note_ignored(const std::vector<std::string>& names);
  // The model's limits and abilities the request checks (server/request_checks.h) hold a request to.
  ServedModel served() const;
  int engine_priority(int request_priority) const;
  // The prompt text of a chat request; forced_prefix (if given) receives the text appended to force a tool
  // call (tool_choice "required" or a named function).
  std::string render_chat(const ChatRequest& request, std::string* forced_prefix) const;
  // A request's images fetched, decoded and preprocessed (on the request thread, not an IO thread), and the
  // prompt's placeholders expanded to each image's tokens; ApiError 400 naming the part on a bad image, or
  // naming mm_processor_kwargs when the request's resize bounds leave the server's.
  std::shared_ptr<const PromptImages> load_images(const std::vector<ImagePart>& parts,
                                                  const ImageResize& resize, std::vector<int32_t>& prompt);
  // The engine's JSON constraint for a response_format (null for text); the token table is built on first
  // use.
  std::shared_ptr<const JsonConstraint> json_constraint(const ResponseFormat& format,
                                                        std::optional<int32_t> start_after_token);

  ServiceOptions options_;
  std::atomic<Engine*> engine_;
  std::atomic<int64_t> max_model_len_;
  const text::Tokenizer* tokenizer_;
  Admission& admission_;
  ServerMetrics& metrics_;
  GenerationContext ctx_;
  int64_t created_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};

  std::mutex token_bytes_mutex_;
  std::shared_ptr<const TokenBytes> token_bytes_;

  ResponseStore response_store_;  // /v1/responses/{id}, previous_response_id, background responses

  std::mutex jobs_mutex_;
  std::vector<std::weak_ptr<GenerationJob>> jobs_;

  static constexpr size_t kMaxIgnoredNamesLogged = 256;
  std::mutex ignored_mutex_;
  std::set<std::string> ignored_logged_;

  // Last, so it stops (and its jobs end) before the members they use go.
  BackgroundRunner background_;
};

}  // namespace moeserve::server
