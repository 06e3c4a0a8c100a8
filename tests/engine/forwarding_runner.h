#pragma once
// ForwardingRunner: a ModelRunner that hands every call to an inner runner, the base of the test runners that
// watch or replace a few calls (OracleDrafts, engine_vision_test's WatchedRunner) and leave the rest to the
// real model.

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/model_runner.h"

namespace moeserve::engine_test {

class ForwardingRunner : public ModelRunner {
 public:
  explicit ForwardingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}

  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_position_embeddings() const override { return inner_->max_position_embeddings(); }
  std::vector<int32_t> eos_token_ids() const override { return inner_->eos_token_ids(); }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return inner_->kv_cache_spec(page_size, num_pages);
  }
  StateCacheSpec state_cache_spec(int num_slots) const override {
    return inner_->state_cache_spec(num_slots);
  }
  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    return inner_->forward(batch, kv, state);
  }
  bool reduces_logits() const override { return inner_->reduces_logits(); }
  int default_logit_candidates() const override { return inner_->default_logit_candidates(); }
  int64_t cache_memory_available() const override { return inner_->cache_memory_available(); }
  bool has_mtp() const override { return inner_->has_mtp(); }
  int64_t hidden_size() const override { return inner_->hidden_size(); }
  void prepare_mtp() override { inner_->prepare_mtp(); }
  KvCacheSpec mtp_kv_cache_spec(int page_size, int64_t num_pages) const override {
    return inner_->mtp_kv_cache_spec(page_size, num_pages);
  }
  std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch, std::span<const int64_t> hidden_rows,
                                 bool from_forward, KvCache& kv) override {
    return inner_->mtp_draft(batch, hidden_rows, from_forward, kv);
  }
  bool has_vision() const override { return inner_->has_vision(); }
  int vision_merge_size() const override { return inner_->vision_merge_size(); }
  std::vector<float> encode_images(std::span<const ImagePatches* const> images) override {
    return inner_->encode_images(images);
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace moeserve::engine_test
