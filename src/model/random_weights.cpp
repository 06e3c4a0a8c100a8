#include "model/random_weights.h"

#include <cmath>
#include <random>

namespace moeserve {

ModelWeights make_random_weights(const ModelConfig& c, const MatrixMaker& make, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&](size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  };
  // Linear layers: bound sqrt(3/in) keeps unit-variance inputs at unit variance.
  auto linear = [&](int64_t out, int64_t in, bool quantizable = true) {
    return make(out, in, std::sqrt(3.0f / float(in)), quantizable);
  };
  auto ffn = [&](int64_t inter) {
    return SwiGlu{linear(inter, c.hidden_size), linear(inter, c.hidden_size), linear(c.hidden_size, inter)};
  };
  const int64_t H = c.hidden_size;
  ModelWeights w;
  w.config = c;
  w.embed = make(c.vocab_size, H, 1.0f, false);
  w.lm_head = linear(c.vocab_size, H, false);
  w.final_norm = uniform(size_t(H), -0.1f, 0.1f);
  auto layer = [&](LayerType type) {
    LayerWeights lw;
    lw.type = type;
    lw.input_norm = uniform(size_t(H), -0.1f, 0.1f);
    lw.post_norm = uniform(size_t(H), -0.1f, 0.1f);
    if (lw.type == LayerType::LinearAttention) {
      const int Hv = c.linear_num_value_heads;
      lw.gdn.in_proj_qkv = linear(c.linear_conv_dim(), H);
      lw.gdn.in_proj_z = linear(c.linear_value_dim(), H);
      lw.gdn.in_proj_b = linear(Hv, H, false);
      lw.gdn.in_proj_a = linear(Hv, H, false);
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
    lw.moe.router = linear(c.num_experts, H, false);
    for (int e = 0; e < c.num_experts; ++e) lw.moe.experts.push_back(ffn(c.moe_intermediate_size));
    if (c.shared_expert_intermediate_size > 0) {
      lw.moe.shared = ffn(c.shared_expert_intermediate_size);
      lw.moe.shared_gate = linear(1, H, false);
    }
    return lw;
  };
  for (int l = 0; l < c.num_layers; ++l) w.layers.push_back(layer(c.layer_types[size_t(l)]));
  // The MTP layer after the rest, so the model's own weights do not depend on whether it is there.
  if (c.mtp_num_layers > 0) {
    MtpWeights& m = w.mtp.emplace();
    m.fc = linear(H, 2 * H);
    m.pre_fc_norm_embedding = uniform(size_t(H), -0.1f, 0.1f);
    m.pre_fc_norm_hidden = uniform(size_t(H), -0.1f, 0.1f);
    m.norm = uniform(size_t(H), -0.1f, 0.1f);
    m.layer = layer(LayerType::FullAttention);
  }
  return w;
}

}  // namespace moeserve
