#pragma once
// Qwen3.5 MoE configurations and models with random weights, for the CUDA backend's model test and benchmark.
// Matrices come from a caller-supplied maker (host bf16 for tests, device memory for the 35B benchmark), so
// the same builder serves both; the small vectors (norms, gates, conv taps) are host floats, as a checkpoint
// loader makes them. Scales keep activations O(1) through any depth.

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "common/error.h"
#include "model/random_weights.h"
#include "model/weights.h"

namespace moeserve::dummy {

// "35b-a3b": Qwen3.5-35B-A3B's text model; "small": the small-moe-realdims fixture's shape. `layers` takes
// the first layers of the 3 GDN + 1 attention pattern.
inline ModelConfig moe_config(const std::string& preset, int layers) {
  ModelConfig c;
  c.model_type = "qwen3_5_moe_text";
  c.dtype = "bfloat16";
  c.is_moe = true;
  c.rms_norm_eps = 1e-6;
  c.partial_rotary_factor = 0.25;
  c.linear_conv_kernel = 4;
  c.norm_topk_prob = true;
  if (preset == "35b-a3b") {
    c.vocab_size = 248320, c.hidden_size = 2048;
    c.num_heads = 16, c.num_kv_heads = 2, c.head_dim = 256, c.rope_theta = 1e7;
    c.linear_num_key_heads = 16, c.linear_num_value_heads = 32;
    c.linear_key_head_dim = c.linear_value_head_dim = 128;
    c.num_experts = 256, c.num_experts_per_tok = 8, c.moe_intermediate_size = 512;
    c.shared_expert_intermediate_size = 512;
  } else if (preset == "small") {
    c.vocab_size = 1024, c.hidden_size = 256;
    c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 256, c.rope_theta = 1e4;
    c.linear_num_key_heads = 2, c.linear_num_value_heads = 4;
    c.linear_key_head_dim = c.linear_value_head_dim = 128;
    c.num_experts = 16, c.num_experts_per_tok = 4, c.moe_intermediate_size = 64;
    c.shared_expert_intermediate_size = 64;
  } else {
    fail("unknown preset '{}' (35b-a3b or small)", preset);
  }
  c.num_layers = layers;
  for (int i = 0; i < layers; ++i)
    c.layer_types.push_back(i % 4 == 3 ? LayerType::FullAttention : LayerType::LinearAttention);
  c.max_position_embeddings = 262144;
  return c;
}

using moeserve::MatrixMaker;

inline ModelWeights random_weights(const ModelConfig& c, const MatrixMaker& make, uint32_t seed = 1) {
  return make_random_weights(c, make, seed);
}

}  // namespace moeserve::dummy
