#include "engine/scheduler.h"

#include <algorithm>
#include <tuple>

namespace moeserve {

namespace {

// A prefill stops at a branch point (where the tree's KV ends beyond its deepest snapshot) to file a snapshot
// there, so the next request sharing that prefix hits it. Below this many extra tokens the extra step is not
// worth it.
constexpr int64_t kMinBranchCheckpoint = 32;

// Longest-prefix-match ordering looks up every waiting request; past this queue length it falls back to FCFS
// (SGLang does the same at 128).
constexpr size_t kLpmMaxQueue = 128;

template <typename T>
void erase_value(std::vector<T>& v, const T& x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

}  // namespace

Scheduler::Scheduler(CacheManager& cache, const SchedulerOptions& options)
    : cache_(cache), options_(options) {}

bool Scheduler::before(const Request* a, const Request* b) const {
  return std::tie(a->priority, a->arrival) < std::tie(b->priority, b->arrival);
}

int64_t Scheduler::chunk_limit(const Request* r) const {
  int64_t limit = options_.chunked_prefill_size;
  if (r->prompt_logprobs_pending) limit = std::min<int64_t>(limit, options_.prompt_logprobs_chunk);
  return std::max<int64_t>(limit, 1);
}

void Scheduler::enqueue(Request* r) {
  waiting_.push_back(r);
}

void Scheduler::remove(Request* r, bool keep) {
  if (r->running) {
    cache_.finish(r->cache, {r->tokens.data(), size_t(r->computed)}, keep);
    erase_value(running_, r);
    r->running = false;
  } else {
    erase_value(waiting_, r);
  }
}

int64_t Scheduler::prefill_room(const Step& step) const {
  const int64_t share =
      std::max<int64_t>(options_.max_num_batched_tokens - step.decode_tokens, options_.min_prefill_tokens);
  return share - step.prefill_tokens;
}

void Scheduler::drop_from_plan(Request* r, Step& step) {
  auto it = std::find_if(step.plan.begin(), step.plan.end(), [&](const auto& c) { return c.request == r; });
  if (it == step.plan.end()) return;
  (r->uncomputed() > 1 ? step.prefill_tokens : step.decode_tokens) -= it->tokens;
  step.plan.erase(it);
}

void Scheduler::preempt(Request* r) {
  cache_.finish(r->cache, {r->tokens.data(), size_t(r->computed)}, true);
  r->computed = 0;
  r->spec.draft.clear();  // drafted after the position it no longer holds
  r->spec.verify.clear();
  r->checkpoint_at = 0;
  if (r->prompt_logprobs_pending) r->prompt_logprobs.clear();  // recomputed from the start
  r->running = false;
  erase_value(running_, r);
  waiting_.push_back(r);
  ++counters_.preemptions;
}

Request* Scheduler::pick_victim(const Request* beneficiary) const {
  Request* victim = nullptr;
  for (Request* r : running_)
    if (r != beneficiary && (victim == nullptr || before(victim, r))) victim = r;
  if (victim != nullptr && beneficiary != nullptr && before(victim, beneficiary)) return nullptr;
  return victim;
}

std::vector<Request*> Scheduler::admission_order() {
  std::vector<Request*> order = waiting_;
  if (options_.policy == SchedulePolicy::Lpm && order.size() <= kLpmMaxQueue) {
    std::vector<std::pair<int64_t, Request*>> keyed;
    for (Request* r : order) {
      int64_t max_hit = r->prompt_logprobs_pending ? 0 : int64_t(r->tokens.size()) - 1;
      keyed.emplace_back(cache_.peek(r->tokens, max_hit).length, r);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      if (a.second->priority != b.second->priority) return a.second->priority < b.second->priority;
      if (a.first != b.first) return a.first > b.first;
      return a.second->arrival < b.second->arrival;
    });
    for (size_t i = 0; i < order.size(); ++i) order[i] = keyed[i].second;
  } else {
    std::stable_sort(order.begin(), order.end(), [&](Request* a, Request* b) { return before(a, b); });
  }
  return order;
}

bool Scheduler::wait_for_shared_prefill(Request* w, int64_t hit, Step& step) {
  for (Request* r : running_) {
    if (r->uncomputed() <= 1 || r->prompt_logprobs_pending) continue;  // not prefilling
    const auto mismatch =
        std::mismatch(w->tokens.begin(), w->tokens.end(), r->tokens.begin(), r->tokens.end());
    const int64_t common = int64_t(mismatch.first - w->tokens.begin());
    const int64_t point = std::min({common, int64_t(w->tokens.size()) - 1, int64_t(r->tokens.size()) - 1});
    if (point - hit < kMinBranchCheckpoint || point <= r->computed) continue;
    // r stops at the point to file a snapshot there (keeping an earlier stop another waiter asked for).
    if (r->checkpoint_at <= r->computed || r->checkpoint_at > point) r->checkpoint_at = point;
    for (auto& c : step.plan) {
      if (c.request == r && r->computed + c.tokens > r->checkpoint_at) {
        step.prefill_tokens -= r->computed + c.tokens - r->checkpoint_at;
        c.tokens = r->checkpoint_at - r->computed;
      }
    }
    return true;
  }
  return false;
}

Scheduler::Admission Scheduler::admit(Request* r, Step& step) {
  const int64_t len = int64_t(r->tokens.size());
  const int64_t max_hit = r->prompt_logprobs_pending ? 0 : len - 1;
  const auto peek = cache_.peek(r->tokens, max_hit);
  if (max_hit > 0 && cache_.prefix_cache_enabled() && wait_for_shared_prefill(r, peek.length, step))
    return Admission::Deferred;
  int64_t n = std::min({len - peek.length, chunk_limit(r), prefill_room(step)});
  r->checkpoint_at = 0;
  const int64_t branch = std::min(peek.kv_length, len - 1);
  if (max_hit > 0 && branch - peek.length >= kMinBranchCheckpoint) {
    r->checkpoint_at = branch;
    n = std::min(n, branch - peek.length);
  }
  // The caller's turn boundary (after a nearer branch point, which advance() moves on from).
  if (max_hit > 0 && cache_.prefix_cache_enabled() &&
      r->snapshot_hint - peek.length >= kMinBranchCheckpoint && r->checkpoint_at == 0) {
    r->checkpoint_at = r->snapshot_hint;
    n = std::min(n, r->snapshot_hint - peek.length);
  }
  if (!cache_.start(r->cache, r->tokens, max_hit, n)) return Admission::NoRoom;

  r->computed = r->cache.cached;
  if (r->cached_tokens < 0) {  // first admission (not a resumption after preemption)
    r->cached_tokens = std::min(r->cache.cached, r->prompt_len);
    counters_.prefix_cache_queries += uint64_t(r->prompt_len);
    counters_.prefix_cache_hits += uint64_t(r->cached_tokens);
  }
  r->running = true;
  erase_value(waiting_, r);
  running_.push_back(r);
  (r->uncomputed() > 1 ? step.prefill_tokens : step.decode_tokens) += n;
  step.plan.push_back({r, n});
  return Admission::Admitted;
}

bool Scheduler::reserve_or_preempt(Request* r, int64_t tokens, Step& step) {
  bool reserved = cache_.reserve(r->cache, r->computed + tokens);
  while (!reserved) {
    Request* victim = pick_victim(r);
    if (victim == nullptr) break;
    drop_from_plan(victim, step);
    preempt(victim);
    reserved = cache_.reserve(r->cache, r->computed + tokens);
  }
  return reserved;
}

void Scheduler::plan_decode(Request* r, Step& step) {
  // A decode step with drafts verifies them too (engine/speculative.h).
  const int64_t n = r->spec.verify.empty() ? r->uncomputed() : int64_t(r->spec.verify.size());
  if (!reserve_or_preempt(r, n, step)) {
    preempt(r);  // everyone left has precedence: r gives way, its progress cached
    return;
  }
  step.plan.push_back({r, n});
  step.decode_tokens += n;
}

void Scheduler::plan_prefill(Request* r, Step& step) {
  int64_t n = std::min({r->uncomputed(), chunk_limit(r), prefill_room(step)});
  if (r->checkpoint_at > r->computed) n = std::min(n, r->checkpoint_at - r->computed);
  if (n <= 0 || !reserve_or_preempt(r, n, step)) return;  // no room or no pages: it waits a step
  step.plan.push_back({r, n});
  step.prefill_tokens += n;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  for (;;) {
    Step step;
    std::vector<Request*> order = running_;
    std::stable_sort(order.begin(), order.end(), [&](Request* a, Request* b) { return before(a, b); });
    // Decodes first, then prefill chunks in what the budget has left; each pass in precedence order. A
    // request skipped here is one preempted by a request ahead of it.
    for (Request* r : order)
      if (r->running && r->uncomputed() <= 1) plan_decode(r, step);
    for (Request* r : order)
      if (r->running && r->uncomputed() > 1) plan_prefill(r, step);

    for (Request* r : admission_order()) {
      if (prefill_room(step) <= 0) break;
      Admission admission = Admission::NoRoom;
      for (;;) {
        if (int(running_.size()) < options_.max_running_requests) {
          admission = admit(r, step);
          if (admission != Admission::NoRoom) break;
        }
        // No slot or no pages: a running request of strictly lower priority gives way.
        Request* victim = pick_victim(nullptr);
        if (victim == nullptr || victim->priority <= r->priority) break;
        drop_from_plan(victim, step);
        preempt(victim);
      }
      if (admission == Admission::NoRoom) break;  // keep the queue order; retry next step
    }
    if (!step.plan.empty() || running_.empty()) return std::move(step.plan);
    // Every running request waits for pages the others hold: give the least important one's back and retry.
    // Each round either plans something or shrinks running_, so this ends.
    preempt(pick_victim(nullptr));
  }
}

void Scheduler::advance(Request* r, int64_t tokens) {
  r->computed += tokens;
  if (r->computed < int64_t(r->tokens.size()))
    cache_.checkpoint(r->cache, {r->tokens.data(), size_t(r->computed)});
  if (r->checkpoint_at <= r->computed)
    r->checkpoint_at = cache_.prefix_cache_enabled() && r->snapshot_hint > r->computed ? r->snapshot_hint : 0;
}

}  // namespace moeserve
