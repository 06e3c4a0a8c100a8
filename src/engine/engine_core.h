#pragma once
// EngineCore: the engine without its thread — requests, scheduler, caches, model and sampling, driven one
// step() at a time. Engine wraps it in a thread with an inbox; tests drive it directly to check invariants
// between steps. Not thread-safe.

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>

#include "cache/cache_manager.h"
#include "engine/encoder_cache.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"

namespace moeserve {

class EngineCore {
 public:
  EngineCore(std::unique_ptr<ModelRunner> model, const EngineOptions& options);

  const EngineCapacity& capacity() const { return capacity_; }
  int64_t vocab_size() const { return vocab_; }
  const std::vector<int32_t>& eos_token_ids() const { return eos_; }

  // Throws moeserve::Error when the request is invalid (see Engine::submit).
  void validate(const GenerateRequest& request) const;
  // Queues a validated request; its id must not be live.
  void add(GenerateRequest request);
  // Finishes the request with FinishReason::Abort; false when no live request has this id.
  bool cancel(const std::string& id);
  void abort_all();
  void flush_cache() { cache_->flush(); }

  bool idle() const { return requests_.empty(); }
  // One forward step (nothing when idle).
  void step();
  // Hands the events that step(), cancel() and abort_all() produced to the requests' callbacks. Separate so
  // the caller can publish stats first: whoever sees an event then sees stats that include it.
  void deliver();

  // Called with a request's id once its final event went out.
  void set_on_retired(std::function<void(const std::string&)> fn) { on_retired_ = std::move(fn); }

  EngineStats stats() const;
  // For tests: throws moeserve::Error on any broken invariant (caches, locks, page ownership).
  void check_invariants() const;

 private:
  struct LogitsRow;
  // Samples r's next token and streams it; false when that finished r (r is gone).
  bool sample_and_emit(Request* r, LogitsRow& row, std::vector<LogprobEntry> prompt_logprobs);
  // r's token from the row (its candidates when they decide it, else the full row, fetched) and its
  // logprobs entry.
  int32_t sample(Request* r, LogitsRow& row, std::span<const int32_t> banned);
  LogprobEntry logprobs(LogitsRow& row, int32_t token, int top_n);
  std::vector<int32_t> banned_tokens(const Request* r, int64_t generated) const;  // eos before min_tokens
  // Marks out finished when `token` (making `generated` output tokens, `length` in all) ends r: an eos or
  // stop id, max_tokens or max_model_len.
  void mark_finish(const Request* r, int32_t token, int64_t generated, int64_t length,
                   GenerateOutput& out) const;
  // Speculative decoding (engine/speculative.h): whether r's step verifies drafts; the verify of T rows
  // (accept, roll back, stream), returning the positions kept, 0 when r finished; drafting after a step.
  bool verifies(const Request* r) const;
  int64_t verify_drafts(Request* r, std::span<LogitsRow> rows);
  void draft(std::span<const DraftJob> jobs);
  // Retires r: releases its caches (filing its tokens in the prefix cache when keep) and sends final_event.
  void finish(Request* r, GenerateOutput final_event, bool keep);
  void finish(Request* r, FinishReason reason, bool keep, std::string error = {});
  void emit(Request* r, GenerateOutput out);  // queues it for deliver()
  // Images: the prompt's layout and cache keys (add), and one step's share of the vision tower's work, which
  // hands requests whose images are all encoded to the scheduler.
  MultimodalPrompt layout_images(const GenerateRequest& request) const;
  void encode_images();

  std::unique_ptr<ModelRunner> model_;
  EngineOptions options_;
  EngineCapacity capacity_;
  std::vector<int32_t> eos_;
  int64_t vocab_ = 0;
  int logit_candidates_ = 0;  // per row, 0 = full rows
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Speculator> spec_;  // when speculative_num_steps > 0
  std::vector<FinalRows> finals_;     // this step's finished requests' rows, for the MTP layer
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::vector<Request*> encoding_;  // requests waiting for their images' features, in arrival order
  EncoderCache encoder_cache_;
  std::mt19937_64 seed_source_{std::random_device{}()};
  uint64_t next_arrival_ = 0;
  EngineStats counters_;
  std::function<void(const std::string&)> on_retired_;
  std::vector<std::pair<std::function<void(const GenerateOutput&)>, GenerateOutput>> outbox_;
};

}  // namespace moeserve
