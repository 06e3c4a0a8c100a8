#include "backend/cpu/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/simd.h"

namespace moeserve::cpu {

void delta_rule_recurrent(const DeltaRuleHead& hd, int64_t T, int dk, int dv, float* S) {
  std::vector<float> delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < T; ++t) {
    const float* kt = hd.k + t * hd.qk_stride;
    const float* qt = hd.q + t * hd.qk_stride;
    const float* vt = hd.v + t * hd.v_stride;
    const float decay = std::exp(hd.g[t * hd.gb_stride]);
    const float beta = hd.beta[t * hd.gb_stride];
    for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= decay;
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (int i = 0; i < dk; ++i) axpy(kt[i], S + i * dv, delta.data(), size_t(dv));  // Sᵀk
    for (int j = 0; j < dv; ++j) delta[j] = (vt[j] - delta[j]) * beta;
    float* o = hd.out + t * hd.out_stride;
    std::fill_n(o, dv, 0.0f);
    for (int i = 0; i < dk; ++i) {
      axpy(kt[i], delta.data(), S + i * dv, size_t(dv));  // S += k ⊗ δ
      axpy(qt[i], S + i * dv, o, size_t(dv));             // o = Sᵀq
    }
  }
}

// Per chunk of L tokens, with γ the in-chunk cumulative log-decay and D[i][j] = e^(γi−γj) for j ≤ i:
//   A = I + strict_lower((β_i k_i · k_j) D[i][j]);  U = A⁻¹ (β v);  W = A⁻¹ (β k e^γ)
//   v' = U − W S;  o = (q e^γ) S + lower_incl((q_i · k_j) D[i][j]) v';  S = S e^γL + Σ_i (k_i e^(γL−γi)) ⊗ v'_i
// A is unit lower triangular, so A⁻¹ is applied by forward substitution.
void delta_rule_chunked(const DeltaRuleHead& hd, int64_t T, int dk, int dv, float* S, int chunk) {
  const size_t n = static_cast<size_t>(chunk);
  std::vector<float> gamma(n), lower(n * n), U(n * dv), W(n * dk), qk(n * n);
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int L = int(std::min<int64_t>(chunk, T - c0));
    auto q = [&](int i) { return hd.q + (c0 + i) * hd.qk_stride; };
    auto k = [&](int i) { return hd.k + (c0 + i) * hd.qk_stride; };
    auto v = [&](int i) { return hd.v + (c0 + i) * hd.v_stride; };
    auto beta = [&](int i) { return hd.beta[(c0 + i) * hd.gb_stride]; };
    float running = 0.0f;
    for (int i = 0; i < L; ++i) gamma[i] = (running += hd.g[(c0 + i) * hd.gb_stride]);

    for (int i = 0; i < L; ++i)
      for (int j = 0; j < L; ++j) {
        const float decay = j <= i ? std::exp(gamma[i] - gamma[j]) : 0.0f;
        const float kk = dot(k(i), k(j), size_t(dk));
        lower[i * chunk + j] = j < i ? beta(i) * kk * decay : 0.0f;
        qk[i * chunk + j] = j <= i ? dot(q(i), k(j), size_t(dk)) * decay : 0.0f;
      }
    // Forward substitution: row i of U (W) = rhs_i − Σ_{j<i} lower[i][j] · row j.
    for (int i = 0; i < L; ++i) {
      float* u = U.data() + size_t(i) * dv;
      float* w = W.data() + size_t(i) * dk;
      const float b = beta(i), eg = std::exp(gamma[i]);
      for (int c = 0; c < dv; ++c) u[c] = b * v(i)[c];
      for (int c = 0; c < dk; ++c) w[c] = b * eg * k(i)[c];
      for (int j = 0; j < i; ++j) {
        axpy(-lower[i * chunk + j], U.data() + size_t(j) * dv, u, size_t(dv));
        axpy(-lower[i * chunk + j], W.data() + size_t(j) * dk, w, size_t(dk));
      }
    }
    // v' = U − W S (in place in U), and the inter-chunk part of the output, (q e^γ) S.
    for (int i = 0; i < L; ++i) {
      float* u = U.data() + size_t(i) * dv;
      float* o = hd.out + (c0 + i) * hd.out_stride;
      std::fill_n(o, dv, 0.0f);
      const float eg = std::exp(gamma[i]);
      for (int r = 0; r < dk; ++r) {
        axpy(-W[size_t(i) * dk + r], S + r * dv, u, size_t(dv));
        axpy(q(i)[r] * eg, S + r * dv, o, size_t(dv));
      }
    }
    // Intra-chunk part: o_i += Σ_{j≤i} qk[i][j] v'_j.
    for (int i = 0; i < L; ++i) {
      float* o = hd.out + (c0 + i) * hd.out_stride;
      for (int j = 0; j <= i; ++j) axpy(qk[i * chunk + j], U.data() + size_t(j) * dv, o, size_t(dv));
    }
    // State update to the end of the chunk.
    const float last = gamma[L - 1], decay_all = std::exp(last);
    for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= decay_all;
    for (int i = 0; i < L; ++i) {
      const float scale = std::exp(last - gamma[i]);
      for (int r = 0; r < dk; ++r) axpy(k(i)[r] * scale, U.data() + size_t(i) * dv, S + r * dv, size_t(dv));
    }
  }
}

}  // namespace moeserve::cpu
