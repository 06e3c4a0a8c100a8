#pragma once
// The OpenAI-compatible API over one engine: routing, API-key auth, readiness and draining, the simple
// endpoints (/health, /v1/models, /metrics, /version, /tokenize, /detokenize), and generation requests
// (/v1/completions, /v1/chat/completions) handed to GenerationJob.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/admission.h"
#include "server/generation.h"
#include "server/http.h"
#include "server/openai_request.h"
#include "server/server_metrics.h"

namespace moeserve::server {

struct ServiceOptions {
  std::string served_model_name = "moeserve";
  std::string model_path;  // "root" in /v1/models
  std::string api_key;     // empty: no auth
  int64_t max_model_len = 0;
  std::chrono::milliseconds queue_timeout{std::chrono::seconds(60)};
  int default_completion_max_tokens = 16;  // /v1/completions without max_tokens, as in OpenAI and vLLM
  std::string version = "0.1.0";

  // Chat: renders the request's messages (+ tools, kwargs) to the prompt text. Null: chat answers 400.
  // Throws ApiError or any std::exception (a template error: 400).
  std::function<std::string(const ChatRequest&)> render_chat;
  // Chat: how each choice's output is split into reasoning / content / tool calls. Null: all content.
  std::function<ChatParserFactory(const ChatRequest&)> chat_parser;
};

class OpenAiService {
 public:
  // engine and tokenizer may be null (tests of routing and errors; a model without tokenizer.json).
  OpenAiService(ServiceOptions options, Engine* engine, const text::Tokenizer* tokenizer, Admission& admission,
                ServerMetrics& metrics);

  Reply handle(HttpRequest& request);  // the HttpServer handler

  void set_ready(bool ready) { ready_ = ready; }
  void set_engine(Engine* engine);  // once loading finishes
  bool ready() const { return ready_ && !draining_; }

  // SIGTERM: /health turns 503 and new generation requests are refused; running ones continue.
  void begin_drain();
  // Generation requests not yet finished (queued or running).
  size_t in_flight();
  // Shutdown timeout reached: stop every generation; responses end with finish_reason "abort".
  void abort_all();

 private:
  Reply route(HttpRequest& request);
  void authorize(const HttpRequest& request) const;
  void check_model(const std::optional<std::string>& model) const;
  void check_generation_ready() const;
  Reply completions(HttpRequest& request);
  Reply chat_completions(HttpRequest& request);
  HttpResponse health() const;
  HttpResponse models(const std::string& id) const;
  HttpResponse tokenize(const HttpRequest& request);
  HttpResponse detokenize(const HttpRequest& request);
  Reply start_job(JobSpec spec);
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens, const char* param) const;

  ServiceOptions options_;
  std::atomic<Engine*> engine_;
  const text::Tokenizer* tokenizer_;
  Admission& admission_;
  ServerMetrics& metrics_;
  GenerationContext ctx_;
  int64_t created_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};

  std::mutex jobs_mutex_;
  std::vector<std::weak_ptr<GenerationJob>> jobs_;
};

}  // namespace moeserve::server
