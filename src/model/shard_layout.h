#pragma once
// ShardLayout: which slice of every split dimension one tensor-parallel rank holds (docs/tp.md has the
// table). Heads split evenly; KV heads (and GDN key heads) are replicated when there are fewer than ranks;
// the vocabulary splits in chunks of ceil(vocab / ranks), the last one possibly shorter.

#include <cstdint>

#include "model/config.h"

namespace moeserve {

struct ShardLayout {
  int rank = 0, size = 1;
  int64_t vocab_chunk = 0;  // rows per rank before the last (the all-gather's unit)
  int64_t vocab_begin = 0, vocab_rows = 0;
  int heads_begin = 0, heads = 0;
  int kv_heads_begin = 0, kv_heads = 0;
  int v_heads_begin = 0, v_heads = 0;  // GDN value heads
  int k_heads_begin = 0, k_heads = 0;  // GDN key heads (the groups the value heads read)
  int64_t moe_inter_begin = 0, moe_inter = 0;
  int64_t shared_inter_begin = 0, shared_inter = 0;
  int64_t dense_inter_begin = 0, dense_inter = 0;

  // Throws, naming the dimension, when `size` ranks cannot split this model.
  static ShardLayout plan(const ModelConfig& config, int rank, int size);
  // The full config with this rank's head counts and intermediate sizes (vocab_size stays the full one).
  ModelConfig local_config(const ModelConfig& full) const;
};

}  // namespace moeserve
