#pragma once
// The gated delta rule of one value head on the CPU, in two mathematically identical forms:
//   recurrent — one token at a time (decode):   S = S·e^g;  δ = (v − Sᵀk)·β;  S += k ⊗ δ;  o = Sᵀq
//   chunked   — WY form over chunks of 64 tokens (prefill), as in HF's torch_chunk_gated_delta_rule.
// q and k are already l2-normalised (q also scaled by 1/sqrt(dk)). Rows are strided so callers can pass
// views into [T][heads][dim] tensors. state is [dk][dv], advanced in place.

#include <cstdint>

namespace moeserve::cpu {

struct DeltaRuleHead {
  const float* q;  // row t at q + t * qk_stride, dk floats
  const float* k;
  int64_t qk_stride;
  const float* v;  // row t at v + t * v_stride, dv floats
  int64_t v_stride;
  const float* g;  // row t at g[t * gb_stride]: log-decay (≤ 0)
  const float* beta;
  int64_t gb_stride;
  float* out;  // row t at out + t * out_stride, dv floats
  int64_t out_stride;
};

void delta_rule_recurrent(const DeltaRuleHead& head, int64_t T, int dk, int dv, float* state);
void delta_rule_chunked(const DeltaRuleHead& head, int64_t T, int dk, int dv, float* state, int chunk = 64);

}  // namespace moeserve::cpu
