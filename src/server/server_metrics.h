#pragma once
// The series `moeserve serve` exports on /metrics, named after vLLM's (`vllm:` -> `moeserve:`) where one
// exists, every one labelled model_name. Request-level series are observed by the server as responses
// progress; engine and admission state is mirrored from snapshots at scrape time.

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "server/admission.h"

namespace moeserve {
struct EngineStats;
}

namespace moeserve::server {

class ServerMetrics {
  MetricsRegistry registry_;  // first: the references below point into it

 public:
  explicit ServerMetrics(const std::string& model_name);

  MetricsRegistry& registry() { return registry_; }

  // Request outcomes.
  void request_finished(const std::string& finish_reason);  // stop, length, tool_calls, abort, error
  void request_error(int status);                           // every response with status >= 400

  // Latencies (seconds) and sizes, observed per request.
  Histogram& ttft;
  Histogram& itl;
  Histogram& e2e;
  Histogram& queue_time;
  Histogram& prompt_tokens_per_request;
  Histogram& generation_tokens_per_request;
  Counter& prompt_tokens;
  Counter& generation_tokens;
  Counter& images;             // images in accepted requests
  Histogram& step_batch_size;  // mirrored from the engine's per-step counts at scrape time

  // Mirrors engine and admission state at scrape time. Either source may be absent (tests, startup).
  void set_sources(std::function<std::optional<EngineStats>()> engine, Admission* admission);

 private:
  void collect();

  std::mutex mutex_;
  std::function<std::optional<EngineStats>()> engine_;
  Admission* admission_ = nullptr;
  // Last engine counter values seen, to advance our counters by the difference.
  uint64_t seen_queries_ = 0, seen_hits_ = 0, seen_steps_ = 0, seen_preemptions_ = 0, seen_full_rows_ = 0;
  uint64_t seen_step_tokens_ = 0;
  uint64_t seen_step_sequences_ = 0;
  uint64_t seen_images_encoded_ = 0, seen_image_patches_ = 0, seen_encoder_hits_ = 0,
           seen_encoder_misses_ = 0;
  uint64_t seen_spec_drafts_ = 0, seen_spec_draft_tokens_ = 0, seen_spec_accepted_ = 0;
  std::vector<uint64_t> seen_spec_per_pos_;
  std::vector<uint64_t> seen_steps_by_batch_;
};

}  // namespace moeserve::server
