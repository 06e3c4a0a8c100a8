#pragma once
// ModelRunner: what the engine needs from a model. The real one wraps Qwen35Model; tests use small doubles
// whose outputs depend on exactly what the caches hold, so a wrong page or a stale GDN snapshot shows up.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/forward_step.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"
#include "vision/preprocess.h"

namespace moeserve {

class Backend;
struct ModelWeights;
struct VisionWeights;  // vision/tower.h

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_position_embeddings() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;
  virtual KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const = 0;
  virtual StateCacheSpec state_cache_spec(int num_slots) const = 0;
  virtual ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) = 0;
  // Whether forward() honours SequenceStep::candidates, and the count worth asking for by default (0 where
  // full rows cost nothing extra, e.g. logits in host memory).
  virtual bool reduces_logits() const { return false; }
  virtual int default_logit_candidates() const { return 0; }
  // Bytes free where the caches live, for EngineOptions::mem_fraction (host MemAvailable unless the model's
  // backend keeps its caches elsewhere).
  virtual int64_t cache_memory_available() const;

  // Speculative decoding (engine/speculative.h) with the model's MTP layer, when it has one: its hidden
  // rows (SequenceStep::hidden, kept where the model runs), its KV cache and its drafting step
  // (Qwen35Model::mtp_draft: row i takes hidden row hidden_rows[i] of the last forward, or of the last
  // mtp_draft when !from_forward; returns each step's greedy draft).
  virtual bool has_mtp() const { return false; }
  virtual int64_t hidden_size() const { return 0; }
  virtual void prepare_mtp() {}
  virtual KvCacheSpec mtp_kv_cache_spec(int page_size, int64_t num_pages) const;
  virtual std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch,
                                         std::span<const int64_t> hidden_rows, bool from_forward,
                                         KvCache& mtp_kv);

  // The vision tower (docs/vision.md), when the model has one: a batch of images to their merged features,
  // concatenated in order, [Σ tokens][hidden_size] in host memory.
  virtual bool has_vision() const { return false; }
  virtual int vision_merge_size() const { return 2; }
  virtual std::vector<float> encode_images(std::span<const ImagePatches* const> images);
};

// The real model: Qwen35Model over `weights` (which must outlive it) on `backend`, or on a CPU backend of its
// own when backend is null; with the vision tower when `vision` is given (it must outlive the runner).
std::unique_ptr<ModelRunner> make_qwen35_runner(const ModelWeights& weights, Backend* backend,
                                                const VisionWeights* vision = nullptr);

}  // namespace moeserve
