#pragma once
// Scheduler: decides, before every forward step, which requests run and how many of their tokens: every
// running request decodes one token or prefills a chunk (continuous batching: requests join and leave between
// steps, prefill chunks ride along with decodes), under a prefill token budget, the running-request limit and
// the memory CacheManager can find. When a running request needs a page that cannot be had, lower-priority
// running requests are preempted: their progress goes into the prefix cache and they wait to resume.
//
// It owns no memory and runs no model (vLLM's split): CacheManager holds pages and slots, the engine executes
// the plan and samples.

#include <cstdint>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "engine/request.h"

namespace moeserve {

struct SchedulerOptions {
  int chunked_prefill_size = 2048;  // prompt tokens of one request per step
  int max_prefill_tokens = 8192;    // prompt tokens of all requests per step
  int max_running_requests = 32;
  SchedulePolicy policy = SchedulePolicy::Fcfs;
  int prompt_logprobs_chunk = 256;  // smaller chunks when every row's logits are kept
};

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t tokens = 0;  // tokens[computed, computed + tokens) run this step
};

struct SchedulerCounters {
  uint64_t prefix_cache_queries = 0;
  uint64_t prefix_cache_hits = 0;
  uint64_t preemptions = 0;
};

class Scheduler {
 public:
  Scheduler(CacheManager& cache, const SchedulerOptions& options);

  void enqueue(Request* r);  // a new request
  // Takes r out of the scheduler (finished or cancelled), releasing its caches; with keep its computed tokens
  // stay in the prefix cache.
  void remove(Request* r, bool keep);

  // This step's work, in batch order. Empty only when nothing can run.
  std::vector<ScheduledChunk> schedule();
  // After the forward pass: r computed `tokens` more; files a snapshot at the end of a prefill chunk.
  void advance(Request* r, int64_t tokens);

  const std::vector<Request*>& running() const { return running_; }
  const std::vector<Request*>& waiting() const { return waiting_; }
  const SchedulerCounters& counters() const { return counters_; }

 private:
  bool before(const Request* a, const Request* b) const;  // a has precedence (priority, then arrival)
  int64_t chunk_limit(const Request* r) const;
  void preempt(Request* r);
  void drop_from_plan(Request* r, int64_t& budget, std::vector<ScheduledChunk>& plan);
  Request* pick_victim(const Request* beneficiary) const;
  enum class Admission { Admitted, Deferred, NoRoom };
  Admission admit(Request* r, int64_t& budget, std::vector<ScheduledChunk>& plan);
  // When a running request is about to prefill a long prefix waiting request w shares beyond w's cache hit,
  // makes it stop there to file a snapshot and tells w to wait for it (n > 1 samples of one prompt, or many
  // requests arriving with one system prompt, compute the shared part once).
  bool wait_for_shared_prefill(Request* w, int64_t hit, int64_t& budget, std::vector<ScheduledChunk>& plan);
  std::vector<Request*> admission_order();

  CacheManager& cache_;
  SchedulerOptions options_;
  std::vector<Request*> running_;
  std::vector<Request*> waiting_;
  SchedulerCounters counters_;
};

}  // namespace moeserve
