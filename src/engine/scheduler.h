#pragma once
// Scheduler: decides, before every forward step, which requests run and how many of their tokens: every
// running request decodes one token or prefills a chunk (continuous batching: requests join and leave between
// steps, prefill chunks ride along with decodes), under a per-step token budget, the running-request limit
// and the memory CacheManager can find. When a running request needs a page that cannot be had,
// lower-priority running requests are preempted: their progress goes into the prefix cache and they wait to
// resume.
//
// The token budget (vLLM's max_num_batched_tokens): every decoding request decodes first, whatever the budget
// (a long prompt never makes a running sequence skip a step), then prefill chunks of running and newly
// admitted requests fill what the decodes leave, but never less than min_prefill_tokens (so a budget full of
// decodes still lets prompts progress: the step then runs over the budget by at most that share).
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
  int max_num_batched_tokens = 8192;  // tokens per step: decodes (drafts included), then prefill chunks
  int min_prefill_tokens = 1024;      // prefill tokens a step may carry however many decodes it has
  int chunked_prefill_size = 8192;    // prompt tokens of one request per step
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
  // One step's plan and the tokens it holds, decodes and prefill chunks apart.
  struct Step {
    std::vector<ScheduledChunk> plan;
    int64_t decode_tokens = 0;
    int64_t prefill_tokens = 0;
  };
  int64_t prefill_room(const Step& step) const;  // prefill tokens the step may still take
  int64_t chunk_limit(const Request* r) const;
  bool reserve_or_preempt(Request* r, int64_t tokens, Step& step);  // pages for r, preempting below it
  void plan_decode(Request* r, Step& step);
  void plan_prefill(Request* r, Step& step);
  void preempt(Request* r);
  void drop_from_plan(Request* r, Step& step);
  Request* pick_victim(const Request* beneficiary) const;
  enum class Admission { Admitted, Deferred, NoRoom };
  Admission admit(Request* r, Step& step);
  // When a running request is about to prefill a long prefix waiting request w shares beyond w's cache hit,
  // makes it stop there to file a snapshot and tells w to wait for it (n > 1 samples of one prompt, or many
  // requests arriving with one system prompt, compute the shared part once).
  bool wait_for_shared_prefill(Request* w, int64_t hit, Step& step);
  std::vector<Request*> admission_order();

  CacheManager& cache_;
  SchedulerOptions options_;
  std::vector<Request*> running_;
  std::vector<Request*> waiting_;
  SchedulerCounters counters_;
};

}  // namespace moeserve
