#include "engine/tp_runner.h"

#include <cstring>
#include <optional>

#include "backend/backend.h"
#include "common/error.h"
#include "dist/communicator.h"
#include "model/qwen35.h"

namespace moeserve {
namespace {

// A step crosses the ranks as: page size, state slots, KV pages, state dtype (so followers size and store
// their caches like rank 0's), then per sequence start_pos, state_slot, all_logits, tokens, page table. An
// empty message: stop.
struct WireSequence {
  std::vector<int32_t> tokens, pages;
  int64_t start_pos = 0;
  int32_t state_slot = 0;
  bool all_logits = false;
};

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
  }
  void put_ids(std::span<const int32_t> v) {
    put(uint32_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size_bytes());
  }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <class T>
  T get() {
    check(pos_ + sizeof(T) <= b_.size(), "tensor-parallel step message truncated at byte {}", pos_);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::vector<int32_t> get_ids() {
    const auto n = get<uint32_t>();
    check(pos_ + n * sizeof(int32_t) <= b_.size(), "tensor-parallel step message truncated at byte {}", pos_);
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), b_.data() + pos_, n * sizeof(int32_t));
    pos_ += n * sizeof(int32_t);
    return v;
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

class TpLeaderRunner final : public ModelRunner {
 public:
  TpLeaderRunner(const ModelWeights& shard, Backend& backend, dist::Communicator& comm)
      : weights_(shard), comm_(comm), model_(shard, backend, &comm) {
    check(comm.rank() == 0, "the tensor-parallel leader runs on rank 0, not {}", comm.rank());
  }
  ~TpLeaderRunner() override {
    std::vector<uint8_t> stop;
    try {
      comm_.broadcast(stop);
    } catch (const std::exception&) {  // the group is already broken; nothing left to stop
    }
  }

  int64_t vocab_size() const override { return weights_.config.vocab_size; }
  int64_t max_position_embeddings() const override { return weights_.config.max_position_embeddings; }
  std::vector<int32_t> eos_token_ids() const override {
    return {weights_.config.eos_token_ids.begin(), weights_.config.eos_token_ids.end()};
  }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    page_size_ = page_size;
    num_pages_ = num_pages;
    return model_.kv_cache_spec(page_size, num_pages);
  }
  StateCacheSpec state_cache_spec(int num_slots) const override {
    num_slots_ = num_slots;
    return model_.state_cache_spec(num_slots);
  }

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    Writer w;
    w.put(int32_t(page_size_));
    w.put(int32_t(num_slots_));
    w.put(int64_t(num_pages_));
    w.put(uint8_t(state.spec().dtype == DType::BF16));
    w.put(uint8_t(kv.spec().dtype));
    w.put(uint32_t(batch.size()));
    for (const auto& s : batch) {
      w.put(s.start_pos);
      w.put(s.state_slot);
      w.put(uint8_t(s.all_logits));
      w.put_ids(s.tokens);
      w.put_ids(s.pages);
    }
    comm_.broadcast(w.bytes);
    return model_.forward(batch, kv, state);
  }

 private:
  const ModelWeights& weights_;
  dist::Communicator& comm_;
  Qwen35Model model_;
  mutable int page_size_ = 0, num_slots_ = 0;
  mutable int64_t num_pages_ = 0;
};

}  // namespace

std::unique_ptr<ModelRunner> make_tp_leader_runner(const ModelWeights& shard, Backend& backend,
                                                   dist::Communicator& comm) {
  return std::make_unique<TpLeaderRunner>(shard, backend, comm);
}

int64_t run_tp_follower(const ModelWeights& shard, Backend& backend, dist::Communicator& comm) {
  check(comm.rank() != 0, "rank 0 leads the tensor-parallel group; it does not follow");
  Qwen35Model model(shard, backend, &comm);
  std::optional<KvCache> kv;
  std::optional<StateCache> state;
  int32_t page_size = 0, num_slots = 0;
  int64_t num_pages = 0, steps = 0;
  DType state_dtype = DType::F32, kv_dtype = DType::F32;
  for (std::vector<uint8_t> bytes;; ++steps) {
    comm.broadcast(bytes);
    if (bytes.empty()) return steps;
    Reader r(bytes);
    const auto ps = r.get<int32_t>(), slots = r.get<int32_t>();
    const auto pages = r.get<int64_t>();
    const DType dtype = r.get<uint8_t>() != 0 ? DType::BF16 : DType::F32;
    const auto kv_type = DType(r.get<uint8_t>());
    if (!kv || ps != page_size || pages != num_pages || slots != num_slots || dtype != state_dtype ||
        kv_type != kv_dtype) {
      page_size = ps, num_pages = pages, num_slots = slots, state_dtype = dtype, kv_dtype = kv_type;
      kv.reset();
      state.reset();
      kv.emplace(model.kv_cache_spec(page_size, num_pages, kv_dtype));
      StateCacheSpec spec = model.state_cache_spec(num_slots);
      spec.dtype = state_dtype;
      state.emplace(spec);
    }
    std::vector<WireSequence> seqs(r.get<uint32_t>());
    std::vector<SequenceStep> batch;
    for (auto& s : seqs) {
      s.start_pos = r.get<int64_t>();
      s.state_slot = r.get<int32_t>();
      s.all_logits = r.get<uint8_t>() != 0;
      s.tokens = r.get_ids();
      s.pages = r.get_ids();
      batch.push_back({s.tokens, s.start_pos, s.pages, s.state_slot, s.all_logits});
    }
    model.forward(batch, *kv, *state);
  }
}

}  // namespace moeserve
