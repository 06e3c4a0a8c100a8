#pragma once
// Engine: continuous-batching generation over one model. One engine thread owns the model, the KV page pool,
// the GDN state slots, the radix prefix cache and the scheduler; other threads talk to it only through this
// class: submit() and cancel() put messages in a thread-safe inbox, and every request's outputs leave through
// its own callback (GenerateRequest::on_output), called on the engine thread.
//
// The engine works on token ids only. Tokenising, chat templates and stop *strings* belong to the caller:
// when its detokenised text hits a stop string it calls cancel(id) and reports "stop" itself.
//
// Typical use (an HTTP handler):
//   GenerateRequest r{.id = "cmpl-1", .prompt = ids, .params = p};
//   r.on_output = [conn](const GenerateOutput& out) { post_to_io_thread(conn, out); };  // must not block
//   engine->submit(std::move(r));        // throws moeserve::Error on bad input (answer 400)
//   ... on client disconnect: engine->cancel("cmpl-1");   // frees its pages within one step

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "vision/preprocess.h"

namespace moeserve {

struct ModelWeights;
struct VisionWeights;
class Backend;
struct JsonConstraint;  // engine/json_constraint.h
class ModelRunner;      // engine/model_runner.h: what the engine needs from a model (the real one or a test
                        // double)

struct SamplingParams {
  float temperature = 1.0f;        // 0 = greedy (argmax)
  float top_p = 1.0f;              // nucleus mass, (0, 1]
  int top_k = 0;                   // 0 or -1 = off
  float min_p = 0.0f;              // drop tokens with p < min_p * p_max; 0 = off
  float presence_penalty = 0.0f;   // OpenAI semantics, over generated tokens: logit -= presence * [count > 0]
  float frequency_penalty = 0.0f;  //                                          logit -= frequency * count
  float repetition_penalty = 1.0f;  // HF/vLLM semantics, over prompt + generated: logit /= p if > 0 else *= p
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias): logit += bias, after the penalties
  std::optional<uint64_t> seed;   // same seed -> same tokens, whatever else shares the batch
  std::optional<int> max_tokens;  // new tokens; unset = until the context (max_model_len) is full
  int min_tokens = 0;             // eos and stop ids are suppressed until this many tokens exist
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // finish "stop" on any of these, in addition to the model's eos ids
  bool logprobs = false;                // logprob of each sampled token
  int top_logprobs = 0;                 // and of the top-N alternatives (needs logprobs)
  std::optional<int>
      prompt_logprobs;  // logprobs of the prompt tokens plus top-N; disables the prefix-cache hit
  // Structured output: every generated token keeps the text a valid prefix of a JSON document of this
  // schema; eos/stop ids only once it is complete (engine/sampler.h). null = free text.
  std::shared_ptr<const JsonConstraint> json;
};

struct GenerateOutput;

// The images of a prompt (docs/vision.md), preprocessed on the caller's thread. The prompt holds, for the
// k-th image, a run of image_token as long as its merged grid (patches / merge²); the engine encodes the
// images on its thread and places their features there. The hash (of the decoded pixels) keys the prefix
// cache: the run's cache keys derive from it, so the same picture hits the cache and a different one never
// does.
struct PromptImage {
  ImagePatches patches;
  std::array<uint64_t, 2> hash{};
};
struct PromptImages {
  int32_t image_token = -1;
  std::vector<PromptImage> images;
};

struct GenerateRequest {
  std::string id;               // unique among live requests; cancel() takes it
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams params;
  int priority = 0;  // smaller runs first (vLLM convention); ties by arrival
  // Called on the engine thread for every event of this request, the last one with finished = true.
  // Must return quickly (hand the event to another thread); may call Engine::cancel.
  std::function<void(const GenerateOutput&)> on_output{};
  // A prompt position worth a GDN snapshot, 0 for none: for chat, where the conversation so far ends and the
  // generation prompt begins. The next turn repeats the prompt up to there but not beyond (the template
  // re-renders the assistant turn), so a snapshot at the end of the prompt alone would never be hit.
  int64_t snapshot_hint = 0;
  // The prompt's images, or null for text (shared by the n choices of one request).
  std::shared_ptr<const PromptImages> images{};
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* to_string(FinishReason reason);  // "stop", "length", "abort", "error" ("" for None)

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The logprobs of one position: the chosen (sampled or prompt) token and the top alternatives, best first.
// Logprobs are log_softmax of the raw model logits (before temperature and penalties), as vLLM reports.
struct LogprobEntry {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache (OpenAI prompt_tokens_details)
};

// One event of a request's stream: the tokens produced since the previous event.
struct GenerateOutput {
  std::string request_id;
  std::vector<int32_t> tokens;         // new token ids (a stop/eos token that ended the request included)
  std::vector<LogprobEntry> logprobs;  // one per entry of tokens, when params.logprobs
  std::vector<LogprobEntry> prompt_logprobs;  // first event only, when asked: prompt positions 1..n-1
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::optional<int32_t> stop_token;  // the eos/stop id that finished it (vLLM's stop_reason)
  std::string error;                  // finish_reason == Error: what went wrong
  Usage usage;                        // running totals
};

// A blocking queue of one request's events, for callers that prefer pulling (CLI, tests, benchmarks):
//   auto stream = std::make_shared<OutputStream>();
//   request.on_output = stream->sink();
//   while (auto out = stream->next()) { ...; if (out->finished) break; }
class OutputStream {
 public:
  OutputStream();
  ~OutputStream();
  std::function<void(const GenerateOutput&)> sink();  // keeps this stream alive
  std::optional<GenerateOutput> next();               // blocks; nullopt after the final event was taken
  std::optional<GenerateOutput> try_next();           // never blocks
  // Blocks until the final event and returns all events merged into one (tokens, logprobs concatenated).
  GenerateOutput collect();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

enum class SchedulePolicy { Fcfs, Lpm };  // first come first served; longest prefix match first

// How GDN state slots are stored. The recurrence always runs in float32; BF16 rounds the state between steps:
// half the bytes per slot (what the slots leave of the budget becomes KV pages; or raise max_running_requests
// and snapshot_slots), at a small cost in accuracy (docs/engine.md). BF16 needs caches in host memory (the
// CPU backend).
enum class StateDtype { F32, BF16 };

struct EngineOptions {
  int page_size = 16;  // tokens per KV page
  // Memory for KV pages plus GDN state slots (live and snapshots). cache_memory_bytes wins when > 0; else
  // mem_fraction of the memory available at start (MemAvailable on CPU) when > 0; else enough for
  // max_running_requests full contexts, capped at a quarter of available memory.
  int64_t cache_memory_bytes = 0;
  double mem_fraction = 0.0;
  // Running requests, one live GDN state slot each (= live slots). With running_from_memory this is an upper
  // bound: as many run as the budget holds, each with its state slots and running_context tokens of KV
  // (docs/engine.md, "Memory budget"); else exactly this many.
  int max_running_requests = 32;
  bool running_from_memory = false;
  int64_t running_context = 0;  // KV tokens planned per running request; 0 = min(max_model_len, 8192)
  int snapshot_slots = -1;  // GDN state snapshots the prefix cache may hold; -1 = 2 x max_running_requests
  StateDtype state_dtype = StateDtype::F32;  // live and snapshot slots alike
  // KV cache elements: F32, BF16 or F8_E4M3; unset = auto (BF16 where the backend keeps the caches in its own
  // memory, a GPU; float32 in host memory, the CPU reference).
  std::optional<DType> kv_cache_dtype;
  // Tokens per forward step (vLLM's max_num_batched_tokens): every decode first, then prefill chunks in what
  // is left, at least an eighth of it (engine/scheduler.h). 0 = by where the caches live: 8192 in a GPU's
  // memory, 2048 in host memory (docs/engine.md, "Scheduler"). Raised to chunked_prefill_size when below.
  int max_num_batched_tokens = 0;
  int chunked_prefill_size = 0;  // prompt tokens of one request per step; 0 = max_num_batched_tokens
  int64_t max_model_len = 0;     // prompt + output limit; 0 = the model's max_position_embeddings
  SchedulePolicy policy = SchedulePolicy::Fcfs;
  bool enable_prefix_cache = true;
  int max_queued_requests = 0;                        // submit() throws when this many wait; 0 = unlimited
  std::optional<std::vector<int32_t>> eos_token_ids;  // unset = the model config's
  Backend* backend = nullptr;  // runs the model (must outlive the engine); null = a CPU backend of its own
  // Sample from each row's leading candidates, reduced where the logits are (a GPU), fetching a full row only
  // when they do not decide the token (engine/sampler.h). -1: kMaxLogitsTopk where the backend keeps its
  // memory on a device, 0 (full rows) on the CPU; 0..kMaxLogitsTopk forces a count (tests).
  int logit_candidates = -1;
  // Speculative decoding with the checkpoint's MTP layer (docs/engine.md#speculative-decoding): drafts per
  // verify step, 0 = off. Each running request then also holds this many extra GDN state slots.
  int speculative_num_steps = 0;
  bool speculative_adaptive = true;  // pause drafting for requests whose drafts keep failing
  // Benchmarks only (bench/; serve and generate never set it): the first N drafts of every verify step are
  // accepted whatever the model says, to time steps at a chosen acceptance length. -1 = off.
  int benchmark_forced_acceptance = -1;
  // The vision tower (docs/vision.md), or null: prompts with images are refused. Must outlive the engine.
  const VisionWeights* vision = nullptr;
  // Vision patches the tower encodes per engine step: whole images, in arrival order, until this many (at
  // least one image), so a burst of large images spreads over steps that also decode other sequences.
  int vision_patches_per_step = 16384;
  // The encoder cache's bound (engine/encoder_cache.h): bytes of merged features kept for images seen again
  // (serve's --mm-encoder-cache-mb); 0 = every image runs through the tower.
  size_t encoder_cache_bytes = size_t(512) << 20;
};

// The rules on EngineOptions that need no model (Engine::create applies them too): a caller checks its flags
// with them before loading one.
void check_engine_options(const EngineOptions& options);

// What the memory budget bought, fixed at create().
struct EngineCapacity {
  int page_size = 0;
  int64_t kv_pages = 0;
  int64_t kv_tokens = 0;  // kv_pages * page_size: tokens that fit in the KV cache at once
  int live_slots = 0;
  int snapshot_slots = 0;
  int64_t kv_bytes = 0;
  DType kv_dtype = DType::F32;
  int64_t state_bytes = 0;  // live + snapshot slots
  StateDtype state_dtype = StateDtype::F32;
  int64_t max_model_len = 0;
  // The running-request count's origin: 0 when max_running_requests was taken as given, else the KV tokens
  // per request it was sized for from the budget (EngineOptions::running_from_memory).
  int64_t running_context = 0;
  // The scheduler's step limits as resolved (EngineOptions::max_num_batched_tokens, chunked_prefill_size).
  int max_num_batched_tokens = 0;
  int chunked_prefill_size = 0;
  std::string summary() const;  // one line for the log
};

// Forward passes by batch size (sequences in the step, prefill chunks and decodes alike): bucket 0 counts
// batches of 1, bucket i of (2^(i-1), 2^i], the last one also everything larger.
constexpr int kStepBatchBuckets = 10;
int step_batch_bucket(size_t sequences);

// Counters are cumulative since start (Prometheus counters); the rest are gauges.
struct EngineStats {
  int running = 0;  // requests holding a live slot (prefilling or decoding)
  int queued = 0;   // waiting, including preempted ones
  int64_t kv_pages_total = 0;
  int64_t kv_pages_used = 0;    // referenced by running requests
  int64_t kv_pages_cached = 0;  // held only by the prefix cache (evictable)
  int64_t kv_pages_free = 0;
  int64_t kv_tokens_total = 0;            // positions the KV cache holds (pages x page size)
  int64_t kv_bytes_per_token = 0;         // K and V of every attention layer, in the stored dtype
  std::string_view kv_dtype = "float32";  // what the pages store: "float32", "bfloat16" or "fp8_e4m3"
  int live_slots_total = 0;               // = the most requests that run at once (EngineCapacity::live_slots)
  int live_slots_used = 0;
  int max_num_batched_tokens = 0;  // the step budget (EngineCapacity::max_num_batched_tokens)
  int snapshot_slots_total = 0;
  int snapshot_slots_used = 0;
  uint64_t prefix_cache_queries = 0;  // prompt tokens looked up (vllm:prefix_cache_queries)
  uint64_t prefix_cache_hits = 0;     // of those, served from cache (vllm:prefix_cache_hits)
  uint64_t prompt_tokens = 0;         // prompt tokens of admitted requests
  uint64_t prefill_tokens = 0;        // prompt tokens actually computed
  uint64_t generation_tokens = 0;
  uint64_t requests_finished = 0;  // any reason
  uint64_t requests_aborted = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;           // forward passes
  uint64_t step_sequences = 0;  // Σ over forward passes of their batch size (mean = this / steps)
  uint64_t step_tokens = 0;     // Σ over forward passes of their tokens (decodes, drafts, prefill)
  std::array<uint64_t, kStepBatchBuckets>
      steps_by_batch{};                 // forward passes by batch size (step_batch_bucket)
  uint64_t sampled_from_full_rows = 0;  // tokens whose candidates did not decide them (logit_candidates)
  // Speculative decoding (vLLM's spec_decode counters); mean acceptance length = 1 + accepted / drafts.
  uint64_t spec_drafts = 0;                     // verify steps with drafts
  uint64_t spec_draft_tokens = 0;               // tokens drafted
  uint64_t spec_accepted_tokens = 0;            // drafted tokens accepted
  std::vector<uint64_t> spec_accepted_per_pos;  // [i]: drafts accepted at position i of their step
  double spec_draft_seconds = 0;                // the MTP layer drafting, wall time on the engine thread
  // Images (docs/vision.md).
  uint64_t images_encoded = 0;
  uint64_t image_patches_encoded = 0;
  double image_encode_seconds = 0;  // the tower's time on the engine thread
  // The encoder cache: images whose features came from it (or from an image encoded in the same step) and
  // images the tower ran for (images_encoded), and the bytes it holds.
  uint64_t encoder_cache_hits = 0;
  uint64_t encoder_cache_misses = 0;
  int64_t encoder_cache_bytes = 0;
};

class Engine {
 public:
  // Starts the engine thread. Throws moeserve::Error when the budget cannot hold one max_model_len request.
  static std::unique_ptr<Engine> create(const ModelWeights& weights, const EngineOptions& options);
  static std::unique_ptr<Engine> create(std::unique_ptr<ModelRunner> model, const EngineOptions& options);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues. Throws moeserve::Error (a message for a 400) on an empty or out-of-vocabulary
  // prompt, prompt + max_tokens over max_model_len, bad sampling values, a duplicate live id, a full queue,
  // or after shutdown.
  void submit(GenerateRequest request);
  // Finishes the request with FinishReason::Abort (its final event still arrives) and frees its pages and
  // slot within one step. False when no live request has this id.
  bool cancel(const std::string& id);

  EngineStats stats() const;  // thread-safe snapshot, refreshed after every step
  const EngineCapacity& capacity() const;
  int64_t vocab_size() const;
  const std::vector<int32_t>& eos_token_ids() const;

  void flush_cache();  // drops everything the prefix cache holds that no request uses
  // Aborts every live request (each gets its final event) and joins the engine thread. Idempotent.
  void shutdown();
  bool alive() const;  // false after shutdown or if the engine thread died

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve
