#pragma once
// StateCache: the Gated-DeltaNet state of sequences, in slots. A slot holds, for every GDN layer, the conv
// state (the last kernel-1 pre-conv qkv columns) and the recurrent state S [Hv][dk][dv] (float32).
// Live sequences and radix-cache snapshots both occupy slots; copy_slot takes or restores a snapshot.
//
// A pool is float32 or bfloat16: half the bytes per slot, so twice the slots in one budget. The recurrence
// still runs in float32 (as vLLM's mamba_ssm_cache_dtype): in host memory the forward pass widens a slot's
// layer with load() before a step and rounds it back with store() after; in a backend's cache memory that
// offers bf16 ranges (CacheMemory::allocate_cache_bf16, the CUDA backend) the kernels read and round the bf16
// values in place. A snapshot copies the rounded bytes, so taking or restoring one adds no rounding of its
// own.

#include <cstdint>
#include <vector>

#include "storage/cache_memory.h"
#include "common/dtype.h"

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
  DType dtype = DType::F32;       // F32 or BF16

  int64_t conv_floats() const { return conv_dim * (conv_kernel - 1); }
  int64_t recurrent_floats() const { return int64_t(num_v_heads) * k_head_dim * v_head_dim; }
  int64_t bytes_per_slot() const {
    return int64_t(num_layers) * (conv_floats() + recurrent_floats()) * int64_t(dtype_size(dtype));
  }
};

class StateCache {
 public:
  explicit StateCache(const StateCacheSpec& spec);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;
  const StateCacheSpec& spec() const { return spec_; }
  bool is_f32() const { return spec_.dtype == DType::F32; }
  // Whether the backend's ops take the slots' state in place (conv/recurrent), rather than through
  // load/store.
  bool in_place() const { return is_f32() || spec_.memory != nullptr; }

  // A slot's state of one layer, in place (in_place() pools): [conv_dim][kernel-1], oldest column first (in
  // spec().memory when set). In a bf16 pool of backend memory this points at the bf16 values: the Backend
  // interface passes state as float*, and the backend knows the range's dtype from its allocation.
  float* conv(int layer, int slot) { return at(conv_, conv16_, offset(layer, slot, spec_.conv_floats())); }
  // [Hv][dk][dv]
  float* recurrent(int layer, int slot) {
    return at(rec_, rec16_, offset(layer, slot, spec_.recurrent_floats()));
  }

  // A host bf16 pool's state of one layer of a slot, widened into conv [conv_floats()] and recurrent
  // [recurrent_floats()], and rounded back (nearest even).
  void load(int layer, int slot, float* conv, float* recurrent) const;
  void store(int layer, int slot, const float* conv, const float* recurrent);

  void clear_slot(int slot);
  void copy_slot(int src, int dst);

 private:
  int64_t offset(int layer, int slot, int64_t per_layer) const {
    return (int64_t(slot) * spec_.num_layers + layer) * per_layer;
  }
  float* at(float* f32, uint16_t* bf16, int64_t i) const {
    return is_f32() ? f32 + i : reinterpret_cast<float*>(bf16 + i);
  }

  StateCacheSpec spec_;
  std::vector<float> host_;  // float32: conv states then recurrent states, when spec.memory is null
  float* conv_ = nullptr;
  float* rec_ = nullptr;
  std::vector<uint16_t> host16_;  // bf16: conv states then recurrent states, when spec.memory is null
  uint16_t* conv16_ = nullptr;
  uint16_t* rec16_ = nullptr;
};

}  // namespace moeserve
