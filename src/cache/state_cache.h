#pragma once
// StateCache: the Gated-DeltaNet state of sequences, in slots. A slot holds, for every GDN layer, the conv
// state (the last kernel-1 pre-conv qkv columns) and the recurrent state S [Hv][dk][dv] (float32).
// Live sequences and radix-cache snapshots both occupy slots; copy_slot takes or restores a snapshot.

#include <cstdint>
#include <vector>

#include "cache/cache_memory.h"

namespace moeserve {

struct StateCacheSpec {
  int num_layers = 0;  // GDN layers
  int64_t conv_dim = 0;
  int conv_kernel = 4;
  int num_v_heads = 0;
  int k_head_dim = 0;
  int v_head_dim = 0;
  int num_slots = 0;
  CacheMemory* memory = nullptr;  // where the slots live (nullptr: host memory)

  int64_t conv_floats() const { return conv_dim * (conv_kernel - 1); }
  int64_t recurrent_floats() const { return int64_t(num_v_heads) * k_head_dim * v_head_dim; }
  int64_t bytes_per_slot() const { return int64_t(num_layers) * (conv_floats() + recurrent_floats()) * 4; }
};

class StateCache {
 public:
  explicit StateCache(const StateCacheSpec& spec);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;
  const StateCacheSpec& spec() const { return spec_; }

  // [conv_dim][kernel-1], oldest column first (in spec().memory when set).
  float* conv(int layer, int slot) { return conv_ + (int64_t(slot) * spec_.num_layers + layer) * spec_.conv_floats(); }
  // [Hv][dk][dv]
  float* recurrent(int layer, int slot) {
    return rec_ + (int64_t(slot) * spec_.num_layers + layer) * spec_.recurrent_floats();
  }

  void clear_slot(int slot);
  void copy_slot(int src, int dst);

 private:
  StateCacheSpec spec_;
  std::vector<float> host_;  // conv states then recurrent states, when spec.memory is null
  float* conv_ = nullptr;
  float* rec_ = nullptr;
};

}  // namespace moeserve
