// The engine on the real model: Qwen35Model (and its vision tower) on the backend.
#include <optional>

#include "backend/backend.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/qwen35.h"
#include "vision/tower.h"

namespace moeserve {

namespace {

class Qwen35Runner : public ModelRunner {
 public:
  Qwen35Runner(const ModelWeights& weights, Backend* backend, const VisionWeights* vision)
      : weights_(weights),
        owned_backend_(backend ? nullptr : make_cpu_backend()),
        model_(weights, backend ? *backend : *owned_backend_) {
    if (vision) {
      check(vision->config.out_hidden_size == weights.config.hidden_size,
            "the vision tower's out_hidden_size {} is not the language model's hidden size {}",
            vision->config.out_hidden_size, weights.config.hidden_size);
      tower_.emplace(*vision, model_.backend());
    }
  }

  int64_t vocab_size() const override { return weights_.config.vocab_size; }
  int64_t max_position_embeddings() const override { return weights_.config.max_position_embeddings; }
  std::vector<int32_t> eos_token_ids() const override {
    return {weights_.config.eos_token_ids.begin(), weights_.config.eos_token_ids.end()};
  }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return model_.kv_cache_spec(page_size, num_pages);
  }
  StateCacheSpec state_cache_spec(int num_slots) const override { return model_.state_cache_spec(num_slots); }
  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    return model_.forward(batch, kv, state);
  }
  bool reduces_logits() const override { return true; }
  bool has_mtp() const override { return model_.has_mtp(); }
  int64_t hidden_size() const override { return weights_.config.hidden_size; }
  void prepare_mtp() override { model_.prepare_mtp(); }
  KvCacheSpec mtp_kv_cache_spec(int page_size, int64_t num_pages) const override {
    return model_.mtp_kv_cache_spec(page_size, num_pages);
  }
  std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch, std::span<const int64_t> hidden_rows,
                                 bool from_forward, KvCache& mtp_kv) override {
    return model_.mtp_draft(batch, hidden_rows, from_forward, mtp_kv);
  }
  int64_t cache_memory_available() const override {
    // A device backend's caches compete for its own memory (on GB10's unified memory: the system's).
    auto device = model_.backend().device_memory();
    return device ? int64_t(device->free_bytes) : ModelRunner::cache_memory_available();
  }
  bool has_vision() const override { return tower_.has_value(); }
  int vision_merge_size() const override { return tower_ ? tower_->config().spatial_merge_size : 2; }
  std::vector<float> encode_images(std::span<const ImagePatches* const> images) override {
    check(tower_.has_value(), "this model has no vision tower");
    return tower_->encode(images);
  }
  int default_logit_candidates() const override {
    return model_.backend().cache_memory() != nullptr ? kMaxLogitsTopk : 0;  // logits on a device
  }

 private:
  const ModelWeights& weights_;
  std::unique_ptr<Backend> owned_backend_;
  Qwen35Model model_;
  std::optional<VisionTower> tower_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_qwen35_runner(const ModelWeights& weights, Backend* backend,
                                                const VisionWeights* vision) {
  return std::make_unique<Qwen35Runner>(weights, backend, vision);
}

std::unique_ptr<Engine> Engine::create(const ModelWeights& weights, const EngineOptions& options) {
  return create(make_qwen35_runner(weights, options.backend, options.vision), options);
}

}  // namespace moeserve
