#pragma once
// One /v1/completions or /v1/chat/completions request in flight: waits for admission, submits one engine
// request per choice, turns engine events into OpenAI JSON (whole, or SSE chunks), and reports metrics.
//
// Threads: engine events arrive on the engine thread and are only queued there (deliver); all text work
// (detokenizing, stop strings, reasoning and tool-call parsing, JSON) happens in poll(), on the connection's
// IO strand. Admission may call back from any thread; that path only submits to the engine.

#include <nlohmann/json.hpp>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/admission.h"
#include "server/http.h"
#include "server/openai_request.h"
#include "server/server_metrics.h"
#include "text/output_parser.h"

namespace moeserve::text {
class Tokenizer;
}

namespace moeserve::server {

// What a job needs from the server; outlives every job.
struct GenerationContext {
  Engine* engine = nullptr;
  const text::Tokenizer* tokenizer = nullptr;  // null: token ids only, no text
  Admission* admission = nullptr;
  ServerMetrics* metrics = nullptr;
  std::string model_name;
};

struct JobSpec {
  enum class Kind { kCompletion, kChat } kind = Kind::kCompletion;
  std::string id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  Clock::time_point arrival;
  std::chrono::milliseconds queue_timeout{0};

  std::vector<std::vector<int32_t>> prompts;  // one per prompt of a batch (chat: one)
  int64_t snapshot_hint = 0;                   // chat: where the generation prompt begins (GenerateRequest)
  std::vector<std::string> prompt_texts;      // for echo: the prompt as text
  int n = 1;
  SamplingParams params;  // per choice; choice i of a seeded request uses seed + i
  int priority = 0;       // engine priority of every choice (smaller first)
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  StreamSettings stream;
  bool echo = false;
  bool return_token_ids = false;
  // Completions: logprobs = number of alternatives; chat: logprobs flag + top_logprobs.
  std::optional<int> logprobs;
  // Chat: how each choice's text splits into reasoning, content and tool calls (null: all content).
  std::optional<text::OutputParserOptions> parser;
  // Chat: text appended to the rendered prompt to force a tool call; it is part of the assistant's output
  // as the client sees it, so it goes through the parser before the generated text.
  std::string assistant_prefix;
};

class GenerationJob : public AsyncBody, public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(GenerationContext& ctx, JobSpec spec);
  ~GenerationJob() override;

  // Enters admission. Throws ApiError (429/503/400) when refused outright.
  void admit();

  void start(std::function<void()> wake) override;
  Step poll(Clock::time_point now) override;
  void cancel() override;

  // Server shutdown: stops generation; the response still ends properly (finish_reason "abort").
  void abort();
  bool finished() const { return done_.load(); }

 private:
  struct Choice;
  struct Event {
    int choice;
    GenerateOutput out;
    Clock::time_point at;
  };

  void on_admitted();
  void deliver(int choice, const GenerateOutput& out);
  void process(Event& ev, std::string& sse);
  std::string finish_chunk(Choice& c);
  std::string chunk_json(nlohmann::ordered_json choice_json);
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json chat_logprobs_json(const Choice& c, size_t from, size_t to) const;
  std::string whole_response();
  void complete(Step& step);
  void release();
  void cancel_engine_requests();
  std::string token_text(int32_t id) const;

  GenerationContext& ctx_;
  JobSpec spec_;
  std::vector<std::unique_ptr<Choice>> choices_;
  std::shared_ptr<Admission::Ticket> ticket_;
  std::optional<Clock::time_point> queue_deadline_;

  std::mutex mutex_;  // guards everything below it
  std::function<void()> wake_;
  std::deque<Event> inbox_;
  bool admitted_ = false;
  std::optional<Clock::time_point> admitted_at_;
  std::string submit_error_;
  bool abort_requested_ = false;

  // IO-strand only.
  bool head_sent_ = false;
  bool cancelled_ = false;
  std::atomic<bool> done_{false};
};

// Builds the 400 vLLM answers when a prompt plus max_tokens exceeds the context.
void check_context_length(const std::vector<int32_t>& prompt, const SamplingParams& params, int64_t max_model_len,
                          const char* prompt_param);

std::string random_id(const char* prefix);

}  // namespace moeserve::server
