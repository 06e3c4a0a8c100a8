#include "server/server_metrics.h"

#include <algorithm>

#include "engine/engine.h"

namespace moeserve::server {

namespace {
// The engine's buckets (EngineStats::steps_by_batch): 1, 2, 4, ..., then +Inf.
std::vector<double> step_batch_buckets() {
  std::vector<double> bounds;
  for (int i = 0; i + 1 < kStepBatchBuckets; ++i) bounds.push_back(double(uint64_t(1) << i));
  return bounds;
}
constexpr const char* kRunning = "moeserve:num_requests_running";
constexpr const char* kWaiting = "moeserve:num_requests_waiting";
constexpr const char* kSpecDrafts = "moeserve:spec_decode_num_drafts_total";
constexpr const char* kSpecDraftTokens = "moeserve:spec_decode_num_draft_tokens_total";
constexpr const char* kSpecAccepted = "moeserve:spec_decode_num_accepted_tokens_total";
constexpr const char* kSpecPerPos = "moeserve:spec_decode_num_accepted_tokens_per_pos_total";
constexpr const char* kSpecLength = "moeserve:spec_decode_mean_acceptance_length";
}  // namespace

ServerMetrics::ServerMetrics(const std::string& model_name)
    : registry_(Labels{{"model_name", model_name}}),
      ttft(registry_.histogram("moeserve:time_to_first_token_seconds",
                               "Time from receiving a request to its first generated token.",
                               latency_buckets())),
      itl(registry_.histogram("moeserve:inter_token_latency_seconds",
                              "Time between consecutive output tokens.", fine_latency_buckets())),
      e2e(registry_.histogram("moeserve:e2e_request_latency_seconds",
                              "Time from receiving a request to its last token.", latency_buckets())),
      queue_time(registry_.histogram("moeserve:request_queue_time_seconds",
                                     "Time a request waited for admission (concurrency limit).",
                                     latency_buckets())),
      prompt_tokens_per_request(registry_.histogram(
          "moeserve:request_prompt_tokens", "Prompt tokens per finished request.", token_count_buckets())),
      generation_tokens_per_request(registry_.histogram("moeserve:request_generation_tokens",
                                                        "Generated tokens per finished request.",
                                                        token_count_buckets())),
      prompt_tokens(registry_.counter("moeserve:prompt_tokens_total", "Prompt tokens of admitted requests.")),
      generation_tokens(registry_.counter("moeserve:generation_tokens_total", "Generated tokens.")),
      images(registry_.counter("moeserve:images_total",
                               "Images in requests the server accepted (decoded and preprocessed).")),
      step_batch_size(registry_.histogram(
          "moeserve:engine_step_batch_size",
          "Sequences in each engine forward pass (prefill chunks and decodes).", step_batch_buckets())),
      seen_steps_by_batch_(kStepBatchBuckets, 0) {
  // Register the remaining families up front so /metrics lists them before the first request.
  registry_.gauge(kRunning, "Sequences generating in the engine.");
  registry_.gauge(kWaiting, "Requests waiting: in the admission queue or the engine's.");
  for (const char* reason : {"stop", "length", "tool_calls", "abort", "error"}) {
    registry_.counter("moeserve:request_success_total", "Finished requests by finish reason.",
                      {{"finished_reason", reason}});
  }
  registry_.counter("moeserve:request_errors_total", "Responses with an error status, by status.",
                    {{"status", "429"}});
  registry_.counter("moeserve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.");
  registry_.counter("moeserve:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.");
  registry_.gauge("moeserve:kv_cache_usage_perc",
                  "Fraction of KV-cache pages used by running requests (0..1).");
  registry_.gauge("moeserve:kv_cache_cached_perc",
                  "Fraction of KV-cache pages held only by the prefix cache.");
  registry_.gauge("moeserve:kv_cache_capacity_tokens",
                  "Token positions the KV cache holds (pages x page size).");
  registry_.gauge("moeserve:kv_cache_bytes_per_token",
                  "Bytes of one token's K and V over every attention layer, in the stored dtype.");
  registry_.gauge("moeserve:state_slots_used", "GDN recurrent-state slots held by running requests.");
  registry_.gauge("moeserve:state_slots_capacity", "GDN recurrent-state slots.");
  registry_.gauge("moeserve:state_snapshots_used", "GDN state snapshots held by the prefix cache.");
  registry_.gauge("moeserve:state_snapshots_capacity", "GDN state snapshot slots.");
  registry_.counter("moeserve:engine_steps_total", "Engine forward passes.");
  registry_.counter("moeserve:engine_step_tokens_total",
                    "Tokens of every engine forward pass (decodes, drafts, prefill chunks).");
  registry_.gauge("moeserve:max_running_requests",
                  "Sequences the engine runs at once at most: what the cache budget holds, capped by "
                  "--max-running-requests.");
  registry_.gauge("moeserve:max_num_batched_tokens",
                  "Tokens per engine step: every decode, then prefill chunks in the rest.");
  registry_.counter("moeserve:num_preemptions_total", "Requests preempted for lack of cache space.");
  registry_.counter("moeserve:sampled_from_full_rows_total",
                    "Tokens the GPU's top logit candidates could not decide (the full row was fetched).");
  // Speculative decoding, as vLLM's spec_decode series (its mean acceptance length is 1 + accepted / drafts).
  registry_.counter(kSpecDrafts, "Verify steps that carried MTP drafts.");
  registry_.counter(kSpecDraftTokens, "Tokens drafted by the MTP layer.");
  registry_.counter(kSpecAccepted, "Drafted tokens accepted.");
  registry_.gauge(kSpecLength,
                  "Mean tokens per verify step since start: 1 + accepted / drafts (0: none yet).");
  registry_.counter("moeserve:image_encoded_total", "Images the vision tower encoded.");
  registry_.counter("moeserve:image_patches_encoded_total", "Vision patches the tower encoded.");
  registry_.counter("moeserve:image_encode_seconds_total", "Time the vision tower ran on the engine thread.");
  registry_.counter("moeserve:image_encoder_cache_hits_total",
                    "Images whose features came from the encoder cache (the tower skipped).");
  registry_.counter("moeserve:image_encoder_cache_misses_total", "Images the encoder cache did not hold.");
  registry_.gauge("moeserve:image_encoder_cache_bytes", "Bytes of features the encoder cache holds.");
  registry_.gauge("moeserve:memory_used_bytes",
                  "Used memory of the most pressured source (cgroup, host or GPU).");
  registry_.gauge("moeserve:memory_total_bytes", "Memory limit of that source.");
  registry_.gauge("moeserve:memory_pressure_threshold_ratio",
                  "Used/total above which new requests are refused with 503 (0: off).");
  registry_.counter("moeserve:memory_throttled_requests_total", "Requests refused for memory pressure.");
  registry_.add_collector([this] { collect(); });
}

void ServerMetrics::request_finished(const std::string& finish_reason) {
  registry_
      .counter("moeserve:request_success_total", "Finished requests by finish reason.",
               {{"finished_reason", finish_reason}})
      .inc();
}

void ServerMetrics::request_error(int status) {
  registry_
      .counter("moeserve:request_errors_total", "Responses with an error status, by status.",
               {{"status", std::to_string(status)}})
      .inc();
}

void ServerMetrics::set_sources(std::function<std::optional<EngineStats>()> engine, Admission* admission) {
  std::lock_guard lock(mutex_);
  engine_ = std::move(engine);
  admission_ = admission;
}

void ServerMetrics::collect() {
  std::lock_guard lock(mutex_);
  std::optional<EngineStats> engine;
  if (engine_) engine = engine_();
  std::optional<Admission::Stats> adm;
  if (admission_) adm = admission_->stats();

  auto& reg = registry_;
  double running = engine ? engine->running : adm ? adm->running : 0;
  double waiting = (engine ? engine->queued : 0) + (adm ? adm->queued : 0);
  reg.gauge(kRunning, "").set(running);
  reg.gauge(kWaiting, "").set(waiting);
  if (engine) {
    auto advance = [&](const char* name, uint64_t now, uint64_t& seen) {
      if (now > seen) reg.counter(name, "").inc(static_cast<double>(now - seen));
      seen = std::max(seen, now);
    };
    advance("moeserve:prefix_cache_queries_total", engine->prefix_cache_queries, seen_queries_);
    advance("moeserve:prefix_cache_hits_total", engine->prefix_cache_hits, seen_hits_);
    advance("moeserve:engine_steps_total", engine->steps, seen_steps_);
    advance("moeserve:engine_step_tokens_total", engine->step_tokens, seen_step_tokens_);
    advance("moeserve:num_preemptions_total", engine->preemptions, seen_preemptions_);
    advance("moeserve:sampled_from_full_rows_total", engine->sampled_from_full_rows, seen_full_rows_);
    advance("moeserve:image_encoded_total", engine->images_encoded, seen_images_encoded_);
    advance("moeserve:image_patches_encoded_total", engine->image_patches_encoded, seen_image_patches_);
    Counter& encode_seconds = reg.counter("moeserve:image_encode_seconds_total", "");
    if (engine->image_encode_seconds > encode_seconds.value())
      encode_seconds.inc(engine->image_encode_seconds - encode_seconds.value());
    advance("moeserve:image_encoder_cache_hits_total", engine->encoder_cache_hits, seen_encoder_hits_);
    advance("moeserve:image_encoder_cache_misses_total", engine->encoder_cache_misses, seen_encoder_misses_);
    reg.gauge("moeserve:image_encoder_cache_bytes", "").set(double(engine->encoder_cache_bytes));
    advance(kSpecDrafts, engine->spec_drafts, seen_spec_drafts_);
    advance(kSpecDraftTokens, engine->spec_draft_tokens, seen_spec_draft_tokens_);
    advance(kSpecAccepted, engine->spec_accepted_tokens, seen_spec_accepted_);
    seen_spec_per_pos_.resize(std::max(seen_spec_per_pos_.size(), engine->spec_accepted_per_pos.size()), 0);
    for (size_t i = 0; i < engine->spec_accepted_per_pos.size(); ++i) {
      const uint64_t now = engine->spec_accepted_per_pos[i];
      Counter& c = reg.counter(kSpecPerPos, "Drafted tokens accepted, by position in their step.",
                               {{"position", std::to_string(i)}});
      if (now > seen_spec_per_pos_[i]) c.inc(static_cast<double>(now - seen_spec_per_pos_[i]));
      seen_spec_per_pos_[i] = std::max(seen_spec_per_pos_[i], now);
    }
    reg.gauge(kSpecLength, "")
        .set(engine->spec_drafts ? 1.0 + double(engine->spec_accepted_tokens) / double(engine->spec_drafts)
                                 : 0.0);
    std::vector<uint64_t> new_steps(kStepBatchBuckets, 0);
    for (size_t i = 0; i < new_steps.size(); ++i) {
      new_steps[i] = engine->steps_by_batch[i] - std::min(engine->steps_by_batch[i], seen_steps_by_batch_[i]);
      seen_steps_by_batch_[i] += new_steps[i];
    }
    uint64_t new_sequences = engine->step_sequences - std::min(engine->step_sequences, seen_step_sequences_);
    seen_step_sequences_ += new_sequences;
    step_batch_size.add(new_steps, static_cast<double>(new_sequences));
    double pages = static_cast<double>(std::max<int64_t>(engine->kv_pages_total, 1));
    reg.gauge("moeserve:kv_cache_usage_perc", "").set(engine->kv_pages_used / pages);
    reg.gauge("moeserve:kv_cache_cached_perc", "").set(engine->kv_pages_cached / pages);
    reg.gauge("moeserve:kv_cache_capacity_tokens", "").set(static_cast<double>(engine->kv_tokens_total));
    reg.gauge("moeserve:kv_cache_bytes_per_token", "").set(static_cast<double>(engine->kv_bytes_per_token));
    reg.gauge("moeserve:kv_cache_dtype_info", "KV cache element type of this server (value 1).",
              {{"dtype", std::string(engine->kv_dtype)}})
        .set(1);
    reg.gauge("moeserve:state_slots_used", "").set(engine->live_slots_used);
    reg.gauge("moeserve:state_slots_capacity", "").set(engine->live_slots_total);
    reg.gauge("moeserve:max_running_requests", "").set(engine->live_slots_total);
    reg.gauge("moeserve:max_num_batched_tokens", "").set(engine->max_num_batched_tokens);
    reg.gauge("moeserve:state_snapshots_used", "").set(engine->snapshot_slots_used);
    reg.gauge("moeserve:state_snapshots_capacity", "").set(engine->snapshot_slots_total);
  }
  if (adm) {
    reg.gauge("moeserve:memory_used_bytes", "").set(static_cast<double>(adm->memory.used_bytes));
    reg.gauge("moeserve:memory_total_bytes", "").set(static_cast<double>(adm->memory.limit_bytes));
    reg.gauge("moeserve:memory_pressure_threshold_ratio", "")
        .set(admission_->options().memory_pressure_threshold);
    Counter& throttled = reg.counter("moeserve:memory_throttled_requests_total", "");
    if (adm->rejected_memory > throttled.value()) {
      throttled.inc(static_cast<double>(adm->rejected_memory) - throttled.value());
    }
  }
}

}  // namespace moeserve::server
