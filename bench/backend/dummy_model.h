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

// make(rows, cols, bound): a matrix with values uniform in [-bound, bound).
using MatrixMaker = std::function<Matrix(int64_t rows, int64_t cols, float bound)>;

inline ModelWeights random_weights(const ModelConfig& c, const MatrixMaker& make, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  auto uniform = [&](size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  };
  // Linear layers: bound sqrt(3/in) keeps unit-variance inputs at unit variance.
  auto linear = [&](int64_t out, int64_t in) { return make(out, in, std::sqrt(3.0f / float(in))); };
  auto ffn = [&](int64_t inter) {
    return SwiGlu{linear(inter, c.hidden_size), linear(inter, c.hidden_size), linear(c.hidden_size, inter)};
  };
  const int64_t H = c.hidden_size;
  ModelWeights w;
  w.config = c;
  w.embed = make(c.vocab_size, H, 1.0f);
  w.lm_head = linear(c.vocab_size, H);
  w.final_norm = uniform(size_t(H), -0.1f, 0.1f);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.type = c.layer_types[size_t(l)];
    lw.input_norm = uniform(size_t(H), -0.1f, 0.1f);
    lw.post_norm = uniform(size_t(H), -0.1f, 0.1f);
    if (lw.type == LayerType::LinearAttention) {
      const int Hv = c.linear_num_value_heads;
      lw.gdn.in_proj_qkv = linear(c.linear_conv_dim(), H);
      lw.gdn.in_proj_z = linear(c.linear_value_dim(), H);
      lw.gdn.in_proj_b = linear(Hv, H);
      lw.gdn.in_proj_a = linear(Hv, H);
      lw.gdn.out_proj = linear(H, c.linear_value_dim());
      lw.gdn.conv1d = uniform(size_t(c.linear_conv_dim() * c.linear_conv_kernel), -0.5f, 0.5f);
      lw.gdn.dt_bias = uniform(size_t(Hv), -1.0f, 1.0f);
      lw.gdn.a_log = uniform(size_t(Hv), 0.0f, 2.5f);
      lw.gdn.norm = uniform(size_t(c.linear_value_head_dim), 0.9f, 1.1f);
    } else {
      lw.attn.q_proj = linear(int64_t(c.num_heads) * 2 * c.head_dim, H);
      lw.attn.k_proj = linear(int64_t(c.num_kv_heads) * c.head_dim, H);
      lw.attn.v_proj = linear(int64_t(c.num_kv_heads) * c.head_dim, H);
      lw.attn.o_proj = linear(H, int64_t(c.num_heads) * c.head_dim);
      lw.attn.q_norm = uniform(size_t(c.head_dim), -0.1f, 0.1f);
      lw.attn.k_norm = uniform(size_t(c.head_dim), -0.1f, 0.1f);
    }
    lw.moe.router = linear(c.num_experts, H);
    for (int e = 0; e < c.num_experts; ++e) lw.moe.experts.push_back(ffn(c.moe_intermediate_size));
    if (c.shared_expert_intermediate_size > 0) {
      lw.moe.shared = ffn(c.shared_expert_intermediate_size);
      lw.moe.shared_gate = linear(1, H);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace moeserve::dummy
