// Each CPU backend op against a naive double-precision reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/simd.h"
#include "naive.h"

namespace moeserve {
namespace {

using testing::Bf16Matrix;
using testing::random_vector;

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

TEST_F(CpuOps, MatmulBf16MatchesNaiveForOddShapes) {
  for (auto [n, rows, cols] : {std::tuple{1, 7, 33}, {5, 11, 37}, {64, 130, 256}}) {
    Bf16Matrix w(rows, cols, 1);
    auto x = random_vector(size_t(n * cols), 2);
    std::vector<float> y(size_t(n * rows));
    be->matmul(x.data(), n, w.view, y.data());
    auto ref = testing::naive_matmul(x, n, w.values, rows, cols);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::abs(ref[i]))) << i;
  }
}

TEST_F(CpuOps, MatmulFp8AppliesBlockScalesIncludingPartialEdgeBlocks) {
  const int64_t rows = 130, cols = 200;  // 2x2 blocks of 128, the last ones partial
  std::vector<uint8_t> q(size_t(rows * cols));
  std::vector<float> scales = {0.5f, 2.0f, 0.25f, 4.0f}, dequant(q.size());
  auto raw = random_vector(q.size(), 3, 2.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      size_t i = size_t(r * cols + c);
      q[i] = f32_to_fp8_e4m3(raw[i]);
      dequant[i] = fp8_e4m3_to_f32(q[i]) * scales[size_t((r / 128) * 2 + c / 128)];
    }
  Matrix w{DType::F8_E4M3, rows, cols, q.data(), scales.data(), 128, 128};
  auto x = random_vector(size_t(3 * cols), 4);
  std::vector<float> y(size_t(3 * rows));
  be->matmul(x.data(), 3, w, y.data());
  auto ref = testing::naive_matmul(x, 3, dequant, rows, cols);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::abs(ref[i]))) << i;
}

TEST_F(CpuOps, VectorisedFp8DecodeMatchesTheTableForEveryFiniteCode) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(uint8_t(c));
  std::vector<float> out(codes.size());
  cpu::fp8_e4m3_to_f32(codes.data(), 0.5f, out.data(), codes.size());
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(out[i], fp8_e4m3_to_f32(codes[i]) * 0.5f) << int(codes[i]);
}

TEST_F(CpuOps, RmsNormZeroCentredAndStrided) {
  const int64_t rows = 3, dim = 8, stride = 16;
  auto x = random_vector(size_t(rows * stride), 5);
  auto w = random_vector(dim, 6, 0.1f);
  std::vector<float> out(size_t(rows * dim));
  be->rms_norm(x.data(), rows, dim, stride, w.data(), 1e-6f, true, out.data(), dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < dim; ++i) ms += double(x[r * stride + i]) * x[r * stride + i];
    double inv = 1 / std::sqrt(ms / dim + 1e-6);
    for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(out[r * dim + i], x[r * stride + i] * inv * (1 + w[i]), 1e-5);
  }
  be->rms_norm(x.data(), rows, dim, stride, w.data(), 1e-6f, false, out.data(), dim);
  double ms = 0;
  for (int64_t i = 0; i < dim; ++i) ms += double(x[i]) * x[i];
  EXPECT_NEAR(out[2], x[2] / std::sqrt(ms / dim + 1e-6) * w[2], 1e-5);
}

TEST_F(CpuOps, RopeRotatesOnlyTheRotaryDimsWithNeoxPairs) {
  const int heads = 2, head_dim = 16, rotary = 8;
  auto x = random_vector(size_t(3 * heads * head_dim), 7);
  auto y = x;
  std::vector<float> inv_freq;
  for (int j = 0; j < rotary / 2; ++j) inv_freq.push_back(float(std::pow(10000.0, -2.0 * j / rotary)));
  be->rope(y.data(), 3, heads, head_dim, rotary, 5, inv_freq.data());
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* a = x.data() + (t * heads + h) * head_dim;
      const float* b = y.data() + (t * heads + h) * head_dim;
      for (int j = 0; j < rotary / 2; ++j) {
        double angle = (5 + t) * std::pow(10000.0, -2.0 * j / rotary);
        EXPECT_NEAR(b[j], a[j] * std::cos(angle) - a[j + 4] * std::sin(angle), 1e-5);
        EXPECT_NEAR(b[j + 4], a[j + 4] * std::cos(angle) + a[j] * std::sin(angle), 1e-5);
      }
      for (int j = rotary; j < head_dim; ++j) EXPECT_EQ(b[j], a[j]);
    }
}

// Dense causal GQA attention in double precision.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int T, int heads, int kv_heads, int hd) {
  std::vector<double> out(size_t(T * heads * hd));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h) {
      int kvh = h / (heads / kv_heads);
      std::vector<double> s(size_t(t + 1));
      for (int p = 0; p <= t; ++p) {
        double acc = 0;
        for (int i = 0; i < hd; ++i) acc += double(q[(t * heads + h) * hd + i]) * k[(p * kv_heads + kvh) * hd + i];
        s[p] = acc / std::sqrt(double(hd));
      }
      double m = *std::max_element(s.begin(), s.end()), total = 0;
      for (auto& x : s) total += (x = std::exp(x - m));
      for (int p = 0; p <= t; ++p)
        for (int i = 0; i < hd; ++i) out[(t * heads + h) * hd + i] += s[p] / total * v[(p * kv_heads + kvh) * hd + i];
    }
  return out;
}

TEST_F(CpuOps, PagedAttentionOverScatteredPagesMatchesDenseCausalAttention) {
  const int T = 37, heads = 4, kv_heads = 2, hd = 16, page_size = 4;
  KvCache kv({1, kv_heads, hd, page_size, 16});
  std::vector<int32_t> pages(10);
  std::iota(pages.begin(), pages.end(), 0);
  std::reverse(pages.begin(), pages.end());  // pages need not be contiguous or ordered
  auto q = random_vector(size_t(T * heads * hd), 8), k = random_vector(size_t(T * kv_heads * hd), 9),
       v = random_vector(size_t(T * kv_heads * hd), 10);
  auto ref = naive_attention(q, k, v, T, heads, kv_heads, hd);

  std::vector<float> out(size_t(T * heads * hd));
  be->paged_attention(q.data(), k.data(), v.data(), T, heads, kv_heads, hd, 0, pages, kv, 0, out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;

  // The same sequence as a 20-token prefill followed by one-token decode steps.
  KvCache kv2({1, kv_heads, hd, page_size, 16});
  std::fill(out.begin(), out.end(), 0.0f);
  be->paged_attention(q.data(), k.data(), v.data(), 20, heads, kv_heads, hd, 0, pages, kv2, 0, out.data());
  for (int t = 20; t < T; ++t)
    be->paged_attention(q.data() + t * heads * hd, k.data() + t * kv_heads * hd, v.data() + t * kv_heads * hd, 1,
                        heads, kv_heads, hd, t, pages, kv2, 0, out.data() + t * heads * hd);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
}

// A bf16 or FP8 cache is attention over the rounded K and V: exactly (to float32 summation order) the dense
// attention of the values the cache holds, prefill and decode alike, FP8 scales applied.
TEST_F(CpuOps, PagedAttentionOverBf16AndFp8PagesIsAttentionOverTheStoredValues) {
  const int T = 37, heads = 4, kv_heads = 2, hd = 16, page_size = 4;
  auto q = random_vector(size_t(T * heads * hd), 18), k = random_vector(size_t(T * kv_heads * hd), 19),
       v = random_vector(size_t(T * kv_heads * hd), 20);
  std::vector<int32_t> pages(10);
  std::iota(pages.begin(), pages.end(), 0);
  std::reverse(pages.begin(), pages.end());
  for (DType dtype : {DType::BF16, DType::F8_E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvCacheSpec spec{1, kv_heads, hd, page_size, 16};
    spec.dtype = dtype;
    const float k_scale = 0.01f, v_scale = 0.02f;  // FP8: codes spread over the range, not the 2^-9 end
    if (dtype == DType::F8_E4M3) spec.k_scales = {k_scale}, spec.v_scales = {v_scale};
    auto stored = [&](const std::vector<float>& x, float scale) {
      std::vector<float> r(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        r[i] = dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(x[i]))
                                    : fp8_e4m3_to_f32(f32_to_fp8_e4m3(x[i] / scale)) * scale;
      return r;
    };
    const auto ks = stored(k, k_scale), vs = stored(v, v_scale);
    auto ref = naive_attention(q, ks, vs, T, heads, kv_heads, hd);
    const auto unrounded = naive_attention(q, k, v, T, heads, kv_heads, hd);
    double exact_diff = 0;  // how far the rounding moved the output: the test must see it
    for (size_t i = 0; i < ref.size(); ++i)
      exact_diff = std::max(exact_diff, std::abs(ref[i] - unrounded[i]));
    EXPECT_GT(exact_diff, 1e-4);

    KvCache kv(spec);
    std::vector<float> out(size_t(T * heads * hd), NAN);
    be->paged_attention(q.data(), k.data(), v.data(), 20, heads, kv_heads, hd, 0, pages, kv, 0, out.data());
    for (int t = 20; t < T; ++t)
      be->paged_attention(q.data() + t * heads * hd, k.data() + t * kv_heads * hd,
                          v.data() + t * kv_heads * hd, 1, heads, kv_heads, hd, t, pages, kv, 0,
                          out.data() + t * heads * hd);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
  }
}

TEST_F(CpuOps, CausalConvCarriesStateAcrossCalls) {
  const int64_t C = 5, T = 9;
  const int K = 4;
  auto x = random_vector(size_t(T * C), 11), w = random_vector(size_t(C * K), 12);
  std::vector<float> full(size_t(T * C)), split(full.size()), state(size_t(C * (K - 1)), 0.0f),
      state2(state.size(), 0.0f);
  be->causal_conv1d_silu(x.data(), T, C, w.data(), K, state.data(), full.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < K; ++j) {
        int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += double(w[c * K + j]) * x[src * C + c];
      }
      ASSERT_NEAR(full[t * C + c], testing::silu(acc), 1e-5);
    }
  // 2 + 1 + 6 tokens: a chunk shorter than the kernel history must still shift the state correctly.
  be->causal_conv1d_silu(x.data(), 2, C, w.data(), K, state2.data(), split.data());
  be->causal_conv1d_silu(x.data() + 2 * C, 1, C, w.data(), K, state2.data(), split.data() + 2 * C);
  be->causal_conv1d_silu(x.data() + 3 * C, 6, C, w.data(), K, state2.data(), split.data() + 3 * C);
  for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(split[i], full[i], 1e-6);
  EXPECT_EQ(state, state2);
}

TEST_F(CpuOps, MoeExpertsMatchesPerTokenTopKMixture) {
  const int E = 6, top_k = 2;
  const int64_t hidden = 12, inter = 8, n = 7;
  std::vector<Bf16Matrix> mats;
  mats.reserve(3 * E);
  std::vector<SwiGlu> experts;
  for (int e = 0; e < E; ++e) {
    mats.emplace_back(inter, hidden, 100 + 3 * e);
    mats.emplace_back(inter, hidden, 101 + 3 * e);
    mats.emplace_back(hidden, inter, 102 + 3 * e);
  }
  for (int e = 0; e < E; ++e) experts.push_back({mats[3 * e].view, mats[3 * e + 1].view, mats[3 * e + 2].view});
  auto x = random_vector(size_t(n * hidden), 13), logits = random_vector(size_t(n * E), 14);
  std::vector<float> out(size_t(n * hidden));
  be->moe_experts(experts, logits.data(), top_k, true, x.data(), n, hidden, out.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[t * E + a] > logits[t * E + b]; });
    double wsum = 0;
    for (int i = 0; i < top_k; ++i) wsum += std::exp(double(logits[t * E + order[i]]));
    for (int64_t o = 0; o < hidden; ++o) {
      double acc = 0;
      for (int i = 0; i < top_k; ++i) {
        int e = order[i];
        double weight = std::exp(double(logits[t * E + e])) / wsum;
        double y = 0;
        for (int64_t j = 0; j < inter; ++j) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < hidden; ++c) {
            g += double(mats[3 * e].values[j * hidden + c]) * x[t * hidden + c];
            u += double(mats[3 * e + 1].values[j * hidden + c]) * x[t * hidden + c];
          }
          y += mats[3 * e + 2].values[o * inter + j] * testing::silu(g) * u;
        }
        acc += weight * y;
      }
      ASSERT_NEAR(out[t * hidden + o], acc, 1e-5) << t << "," << o;
    }
  }
}

TEST_F(CpuOps, GdnGatesFollowSoftplusThreshold) {
  float b[2] = {0.3f, -1.0f}, a[2] = {25.0f, -0.5f}, a_log[2] = {0.1f, 0.7f}, dt_bias[2] = {0.0f, 1.0f};
  float beta[2], g[2];
  be->gdn_gates(b, a, a_log, dt_bias, 1, 2, beta, g);
  EXPECT_NEAR(beta[0], testing::sigmoid(0.3), 1e-6);
  EXPECT_NEAR(g[0], -std::exp(0.1) * 25.0, 1e-4);  // softplus(x) = x above 20
  EXPECT_NEAR(g[1], -std::exp(0.7) * std::log1p(std::exp(0.5)), 1e-5);
}

}  // namespace
}  // namespace moeserve
