#pragma once
// ModelWeights: every tensor the Qwen3.5 forward pass reads, as typed views. Large matrices stay where the
// checkpoint put them (memory-mapped, in their stored dtype: BF16, F16, F32 or block-scaled FP8 E4M3);
// small vectors (norm weights, A_log, dt_bias, conv taps) are widened to float32 at load.
// The views are valid as long as the ModelWeights that holds their storage lives.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/matrix.h"
#include "model/config.h"
#include "model/shard_layout.h"

namespace moeserve {

struct GdnWeights {
  Matrix in_proj_qkv;          // [2*key_dim + value_dim, hidden]
  Matrix in_proj_z;            // [value_dim, hidden]
  Matrix in_proj_b;            // [Hv, hidden]
  Matrix in_proj_a;            // [Hv, hidden]
  Matrix out_proj;             // [hidden, value_dim]
  std::vector<float> conv1d;   // [conv_dim][kernel]
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> a_log;    // [Hv]
  std::vector<float> norm;     // [value_head_dim], plain scale (not zero-centred)
};

struct AttentionWeights {
  Matrix q_proj;  // [heads * 2 * head_dim, hidden]: per head, head_dim query rows then head_dim gate rows
  Matrix k_proj, v_proj;  // [kv_heads * head_dim, hidden]
  Matrix o_proj;          // [hidden, heads * head_dim]
  std::vector<float> q_norm, k_norm;  // [head_dim], zero-centred
  // The checkpoint's FP8 KV cache scales (a stored code times the scale is the value); 0 = none given.
  float k_scale = 0, v_scale = 0;
};

struct MoeWeights {
  Matrix router;                    // [experts, hidden]
  std::vector<SwiGlu> experts;  // per expert (fused checkpoints become views into the fused tensor)
  SwiGlu shared;                // empty matrices when the model has no shared expert
  Matrix shared_gate;               // [1, hidden]
};

struct LayerWeights {
  LayerType type = LayerType::LinearAttention;
  std::vector<float> input_norm, post_norm;  // [hidden], zero-centred
  GdnWeights gdn;         // LinearAttention layers
  AttentionWeights attn;  // FullAttention layers
  MoeWeights moe;         // MoE models
  SwiGlu mlp;         // dense models
};

// The multi-token-prediction layer (mtp.*, docs/qwen35-model.md §5): drafts the token after next from the
// main model's final-normed hidden state and the next token. Embedding and lm_head are the main model's.
struct MtpWeights {
  Matrix fc;  // [hidden, 2 * hidden]: input columns [normed embedding, normed hidden]
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;  // [hidden], zero-centred
  LayerWeights layer;  // a full-attention decoder layer (MoE or dense, as the main model's)
};

struct ModelWeights {
  ModelConfig config;
  Matrix embed;    // [vocab, hidden]
  Matrix lm_head;  // [vocab, hidden]; the same view as embed when tie_word_embeddings
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;  // when the checkpoint has mtp.* tensors
  // The part of the model these weights are under tensor parallelism (model/tensor_parallel.h); the
  // default (size 1) is all of it.
  ShardLayout shard;
  // Keeps the mapped files and any converted buffers alive (type-erased so this header stays small).
  std::vector<std::shared_ptr<void>> storage;
};

}  // namespace moeserve
