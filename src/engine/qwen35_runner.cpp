// The engine on the real model: Qwen35Model on the CPU backend.
#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/qwen35.h"

namespace moeserve {

namespace {

class Qwen35Runner : public ModelRunner {
 public:
  Qwen35Runner(const ModelWeights& weights, Backend* backend)
      : weights_(weights),
        owned_backend_(backend ? nullptr : make_cpu_backend()),
        model_(weights, backend ? *backend : *owned_backend_) {}

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
  ForwardOutput mtp_forward(std::span<const SequenceStep> batch, std::span<const float> hidden,
                            KvCache& mtp_kv) override {
    return model_.mtp_forward(batch, hidden, mtp_kv);
  }
  int64_t cache_memory_available() const override {
    // A device backend's caches compete for its own memory (on GB10's unified memory: the system's).
    auto device = model_.backend().device_memory();
    return device ? int64_t(device->free_bytes) : ModelRunner::cache_memory_available();
  }
  int default_logit_candidates() const override {
    return model_.backend().cache_memory() != nullptr ? kMaxLogitsTopk : 0;  // logits on a device
  }

 private:
  const ModelWeights& weights_;
  std::unique_ptr<Backend> owned_backend_;
  Qwen35Model model_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_qwen35_runner(const ModelWeights& weights, Backend* backend) {
  return std::make_unique<Qwen35Runner>(weights, backend);
}

std::unique_ptr<Engine> Engine::create(const ModelWeights& weights, const EngineOptions& options) {
  return create(make_qwen35_runner(weights, options.backend), options);
}

}  // namespace moeserve
