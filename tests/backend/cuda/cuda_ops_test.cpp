// Every CUDA backend op against the CPU backend (the reference) on random inputs, at the fixtures' small
// shapes and at the 35B-A3B shapes. Outputs are poisoned with NaN first, so an unwritten element fails.
// Tolerances: float32 paths agree to summation order (1e-5..1e-4 of the output's scale); the bf16 tensor-core
// paths (cuBLAS, WMMA experts) round activations to bf16 (2^-9 relative), so they get 2e-2.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/qwen35.h"

namespace moeserve {
namespace {

using namespace testing;  // moeserve::testing: cuda_test_util.h

class CudaOps : public CudaAgainstCpu {
 protected:
  WeightStore store;
};

// FP8 takes three paths by batch size: the GEMV (≤ 8 rows; two or four weight rows per warp, rows past the
// matrix clamped), tensor cores over the FP8 bytes (9..64 rows; 32-row tiles clamped at the edge, token tiles
// of 16 or 32, several token groups past 32) and the bf16-widened cuBLAS matmul (above 64). Matrices of
// fewer than 512 outputs stay float32-accurate at every batch size: the GEMV, then cuBLAS's SGEMM over a
// float32 copy (from 64 rows), or for bf16 weights of ≥ 128 outputs from 1,024 rows x in three bf16 terms
// through bf16 GEMMs, so they are held to the exact bound.
TEST_F(CudaOps, MatmulEveryDtypeAndBatchSize) {
  for (DType dt : {DType::BF16, DType::F32, DType::F16, DType::F8_E4M3})
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{7, 33}, {130, 256}, {520, 2048}, {4099, 384}, {1000, 640}}) {
      if (dt == DType::F8_E4M3 && cols % 16) continue;
      Matrix w = store.make(dt, rows, cols, uint32_t(rows + cols));
      for (int64_t n : {1, 3, 8, 9, 16, 17, 33, 64, 70, 300, 1100}) {
        auto x = random_vector(size_t(n * cols), uint32_t(n));
        std::vector<float> ref(size_t(n * rows));
        cpu->matmul(x.data(), n, w, ref.data());
        for (Backend* be : {gpu32.get(), gpu.get()}) {
          auto xd = to_device(*be, x);
          auto yd = poisoned(*be, ref.size());
          be->matmul(xd.get(), n, w, yd.get());
          const bool rounded =
              be == gpu.get() && n > 8 && rows >= 512 && (dt == DType::BF16 || dt == DType::F8_E4M3);
          EXPECT_LT(rel_error(to_host(*be, yd.get(), ref.size()), ref), rounded ? kBf16 : kExact)
              << dtype_name(dt) << " " << rows << "x" << cols << " n=" << n << " on " << be->name()
              << (be == gpu32.get() ? " fp32" : " bf16");
        }
      }
    }
}

// The FP8 tensor-core paths widen the weights to bf16 by moving the code's bits (mma_fp8.cuh): every code,
// subnormals and negative zero included, must enter the MMA as its exact value. Row r of the matrix holds
// code r % 256 (NaN codes as zero) in every column, so each output is that value times a positive row sum
// and a code widened wrongly shows in its own rows.
TEST_F(CudaOps, Fp8MatmulTakesEveryE4m3CodeExactly) {
  const int64_t rows = 512, cols = 256;
  Matrix w = store.make_fp8_codes(rows, cols, [](int64_t r, int64_t) {
    const uint8_t code = uint8_t(r % 256);
    return (code & 0x7f) == 0x7f ? uint8_t(0) : code;
  });
  for (int64_t n : {4, 16, 40}) {
    auto x = random_vector(size_t(n * cols), uint32_t(n + 5));
    // Positive, so no row sum is near zero, and bf16 values, so bf16 mode's rounding of them changes nothing.
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(1.0f + 0.5f * v));
    std::vector<float> ref(size_t(n * rows));
    cpu->matmul(x.data(), n, w, ref.data());
    for (Backend* be : {gpu32.get(), gpu.get()}) {
      auto xd = to_device(*be, x);
      auto yd = poisoned(*be, ref.size());
      be->matmul(xd.get(), n, w, yd.get());
      const auto got = to_host(*be, yd.get(), ref.size());
      int wrong = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        if (!(std::abs(got[i] - ref[i]) <= 1e-5 * std::abs(ref[i])) && wrong++ < 4)
          ADD_FAILURE() << "n=" << n << " row " << i % rows << " (code " << i % rows % 256 << "): " << got[i]
                        << " vs " << ref[i] << (be == gpu32.get() ? " fp32" : " bf16");
    }
  }
}

// Paths that quantize the activations to e4m3 per 1x128 block (FP8 prefill matmuls, FP8 experts from 9
// tokens): e4m3's 3 mantissa bits, ~3% relative on random rows. The experts round twice (x, then h), and over
// thousands of rows the largest error reached 5.8% of the largest output (3,100 tokens, 12,400 pairs).
constexpr double kFp8Activations = 0.07;

// Prefill-sized FP8 matmuls: cuBLASLt's block-scaled FP8 GEMM where its heuristic offers one (activations
// quantized per token and 128 columns: e4m3's rounding of x, a few percent), else the weights widened to
// bf16 (the H200 with CUDA 13 today, docs/cuda.md); either holds kFp8Activations.
TEST_F(CudaOps, Fp8PrefillMatmulQuantizesActivationsPerBlock) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 2048}, {2048, 512}, {384, 256}}) {
    Matrix w = store.make(DType::F8_E4M3, rows, cols, uint32_t(rows + 3 * cols));
    for (int64_t n : {65, 200, 1000}) {
      auto x = random_vector(size_t(n * cols), uint32_t(n + 5));
      for (int64_t i = 0; i < n; i += 7) x[size_t(i * cols)] *= 50.0f;    // outliers: per-block scales matter
      for (int64_t c = 0; c < cols; ++c) x[size_t(3 * cols + c)] = 0.0f;  // an all-zero row
      std::vector<float> ref(size_t(n * rows));
      cpu->matmul(x.data(), n, w, ref.data());
      auto xd = to_device(*gpu, x);
      auto yd = poisoned(*gpu, ref.size());
      gpu->matmul(xd.get(), n, w, yd.get());
      const auto got = to_host(*gpu, yd.get(), ref.size());
      EXPECT_LT(rel_error(got, ref), kFp8Activations) << rows << "x" << cols << " n=" << n;
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(got[size_t(3 * rows + r)], 0.0f) << "zero row, col " << r;
    }
  }
}

// The FP8 fixtures' shapes (hidden 256: attention q 1024x256, k/v 256x256, o 256x512; GDN 512x256, out
// 256x512) and a few with K = 512 and 1024 at prefill sizes on both sides of multiples of 4 and 128 tokens:
// each (rows, cols, n) gets its own cuBLASLt algorithm (K = 256 gave wrong ones from 128 tokens: those shapes
// take the bf16 path).
TEST_F(CudaOps, Fp8PrefillMatmulAtSmallModelShapes) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 256},
                            {256, 512},
                            {512, 256},
                            {1024, 256},
                            {768, 256},
                            {768, 512},
                            {512, 1024}}) {
    Matrix w = store.make(DType::F8_E4M3, rows, cols, uint32_t(7 * rows + cols));
    for (int64_t n : {65, 128, 129, 200, 256, 300}) {
      auto x = random_vector(size_t(n * cols), uint32_t(n + 11));
      std::vector<float> ref(size_t(n * rows));
      cpu->matmul(x.data(), n, w, ref.data());
      auto xd = to_device(*gpu, x);
      auto yd = poisoned(*gpu, ref.size());
      gpu->matmul(xd.get(), n, w, yd.get());
      EXPECT_LT(rel_error(to_host(*gpu, yd.get(), ref.size()), ref), kFp8Activations)
          << rows << "x" << cols << " n=" << n;
    }
  }
}

TEST_F(CudaOps, NormsRopeAndElementwise) {
  const int64_t rows = 5, dim = 256, stride = 512, H = 2048;
  // Weight vectors live for the whole test: the backend keys its device copies by host address.
  auto x = random_vector(size_t(rows * stride), 1), w = random_vector(dim, 2, 0.1f);
  auto wn = random_vector(H, 6, 0.1f);
  auto al = random_vector(32, 16), dt = random_vector(32, 17);
  const int heads = 3, hd = 256, rot = 64;
  std::vector<float> inv_freq;
  for (int j = 0; j < rot / 2; ++j) inv_freq.push_back(float(std::pow(1e7, -2.0 * j / rot)));
  for (bool zc : {true, false}) {
    std::vector<float> ref(size_t(rows * dim));
    cpu->rms_norm(x.data(), rows, dim, stride, w.data(), 1e-6f, zc, ref.data(), dim);
    auto xd = to_device(*gpu, x);
    auto out = poisoned(*gpu, ref.size());
    gpu->rms_norm(xd.get(), rows, dim, stride, w.data(), 1e-6f, zc, out.get(), dim);
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), kExact) << "rms_norm zero_centred=" << zc;
  }
  {  // in place, as the model normalises k heads
    auto y = random_vector(size_t(rows * dim), 3), ref = y;
    cpu->rms_norm(ref.data(), rows, dim, dim, w.data(), 1e-6f, true, ref.data(), dim);
    auto yd = to_device(*gpu, y);
    gpu->rms_norm(yd.get(), rows, dim, dim, w.data(), 1e-6f, true, yd.get(), dim);
    EXPECT_LT(rel_error(to_host(*gpu, yd.get(), ref.size()), ref), kExact) << "rms_norm in place";
  }
  {  // the fused residual add
    auto h = random_vector(size_t(3 * H), 4), y = random_vector(size_t(3 * H), 5);
    auto h_ref = h;
    std::vector<float> ref(h.size());
    cpu->add_rms_norm(h_ref.data(), y.data(), 3, H, wn.data(), 1e-6f, ref.data());
    auto hd = to_device(*gpu, h), yd = to_device(*gpu, y);
    auto out = poisoned(*gpu, ref.size());
    gpu->add_rms_norm(hd.get(), yd.get(), 3, H, wn.data(), 1e-6f, out.get());
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), kExact) << "add_rms_norm out";
    EXPECT_LT(rel_error(to_host(*gpu, hd.get(), h.size()), h_ref), kExact) << "add_rms_norm residual";
  }
  // Gated norm, in place: a warp per row for dims of whole float4s up to 512 (several rows per block, a
  // partial last block, lanes past a short row idle), a block per row otherwise. The backend keeps a weight
  // vector's upload by address, so each case's weights live to the end of the test.
  std::deque<std::vector<float>> norm_weights;
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{12, 128}, {37, 96}, {5, 512}, {9, 130}}) {
    auto o = random_vector(size_t(rows * dim), 7), z = random_vector(size_t(rows * dim), 8);
    const auto& wd = norm_weights.emplace_back(random_vector(size_t(dim), 9));
    auto ref = o;
    cpu->gated_rms_norm(ref.data(), z.data(), rows, dim, wd.data(), 1e-6f, ref.data());
    auto od = to_device(*gpu, o), zd = to_device(*gpu, z);
    gpu->gated_rms_norm(od.get(), zd.get(), rows, dim, wd.data(), 1e-6f, od.get());
    EXPECT_LT(rel_error(to_host(*gpu, od.get(), ref.size()), ref), kExact) << "gated_rms_norm " << dim;
  }
  {  // partial RoPE at a large position
    auto q = random_vector(size_t(5 * heads * hd), 10), ref = q;
    cpu->rope(ref.data(), 5, heads, hd, rot, 70000, inv_freq.data());
    auto qd = to_device(*gpu, q);
    gpu->rope(qd.get(), 5, heads, hd, rot, 70000, inv_freq.data());
    EXPECT_LT(rel_error(to_host(*gpu, qd.get(), ref.size()), ref), 1e-4) << "rope";
  }
  {  // elementwise
    auto a = random_vector(1000, 11), b = random_vector(1000, 12), g = random_vector(1000, 13);
    auto ref = a;
    cpu->add(ref.data(), b.data(), ref.size());
    auto ad = to_device(*gpu, a), bd = to_device(*gpu, b), gd = to_device(*gpu, g);
    gpu->add(ad.get(), bd.get(), a.size());
    EXPECT_LT(rel_error(to_host(*gpu, ad.get(), a.size()), ref), kExact) << "add";
    cpu->mul_sigmoid(ref.data(), g.data(), 10, 50, 100);
    gpu->mul_sigmoid(ad.get(), gd.get(), 10, 50, 100);
    EXPECT_LT(rel_error(to_host(*gpu, ad.get(), 500), std::vector<float>(ref.begin(), ref.begin() + 500)),
              kExact)
        << "mul_sigmoid";
    cpu->add_sigmoid_gated(ref.data(), b.data(), g.data(), 10, 100);
    gpu->add_sigmoid_gated(ad.get(), bd.get(), gd.get(), 10, 100);
    EXPECT_LT(rel_error(to_host(*gpu, ad.get(), a.size()), ref), kExact) << "add_sigmoid_gated";
    auto cd = poisoned(*gpu, 1000);
    gpu->copy(ad.get(), cd.get(), 1000);
    gpu->fill_zero(cd.get(), 10);
    auto c = to_host(*gpu, cd.get(), 1000), a_now = to_host(*gpu, ad.get(), 1000);
    EXPECT_EQ(std::count(c.begin(), c.begin() + 10, 0.0f), 10);
    EXPECT_EQ(std::vector<float>(c.begin() + 10, c.end()),
              std::vector<float>(a_now.begin() + 10, a_now.end()));
  }
  {  // gates of the delta rule
    auto b = random_vector(7 * 32, 14), a = random_vector(7 * 32, 15, 10.0f);
    std::vector<float> beta(b.size()), g(b.size());
    cpu->gdn_gates(b.data(), a.data(), al.data(), dt.data(), 7, 32, beta.data(), g.data());
    auto bd = to_device(*gpu, b), ad = to_device(*gpu, a);
    auto betad = poisoned(*gpu, b.size()), gd = poisoned(*gpu, b.size());
    gpu->gdn_gates(bd.get(), ad.get(), al.data(), dt.data(), 7, 32, betad.get(), gd.get());
    EXPECT_LT(rel_error(to_host(*gpu, betad.get(), b.size()), beta), kExact) << "beta";
    EXPECT_LT(rel_error(to_host(*gpu, gd.get(), b.size()), g), kExact) << "g";
  }
}

TEST_F(CudaOps, EmbedAndArgmax) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    Matrix table = store.make(dt, 1000, 256, 20);
    std::vector<int32_t> tokens = {0, 999, 17, 17, 500};
    std::vector<float> ref(tokens.size() * 256);
    cpu->embed(tokens, table, ref.data());
    auto out = poisoned(*gpu, ref.size());
    gpu->embed(tokens, table, out.get());
    EXPECT_EQ(to_host(*gpu, out.get(), ref.size()), ref) << dtype_name(dt);
  }
  const int64_t cols = 248320;
  auto x = random_vector(size_t(3 * cols), 21);
  x[5] = 100.0f;                         // row 0: a clear maximum
  x[cols + 7] = x[cols + 9000] = 50.0f;  // row 1: a tie goes to the first
  x[2 * cols + cols - 1] = 60.0f;        // row 2: the last column
  auto xd = to_device(*gpu, x);
  int32_t ids[3];
  gpu->argmax(xd.get(), 3, cols, ids);
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 7);
  EXPECT_EQ(ids[2], cols - 1);
}

// Sampling's reduction of logits rows: the same candidates (values and ids, ties to the lower id) as the
// CPU's reference, the same max, and the sums to float32 summation order.
TEST_F(CudaOps, LogitsTopkMatchesTheCpu) {
  for (int64_t cols : {int64_t(248320), int64_t(20000), int64_t(1000), int64_t(100)}) {
    const int64_t rows = 6;
    std::vector<float> x = random_vector(size_t(rows * cols), uint32_t(cols));
    for (int64_t c = 0; c < cols; ++c) {
      x[size_t(c)] *= 8.0f;                                 // row 0: peaked
      x[size_t(cols + c)] = float(c % 7);                   // row 1: many ties
      x[size_t(2 * cols + c)] = c % 3 ? -INFINITY : -1.0f;  // row 2: mostly -inf
    }
    x[size_t(3 * cols + cols - 1)] = 1e30f;  // row 3: the maximum in the last column
    x[size_t(4 * cols + cols / 2)] = -1e30f;
    const std::vector<float> temps = {1.0f, 0.7f, 2.0f, 1.0f, 0.05f, 1.3f};
    auto xd = to_device(*gpu, x);
    for (int k : {1, 20, 256}) {
      SCOPED_TRACE(::testing::Message() << "cols " << cols << " k " << k);
      const int64_t stride = logits_topk_record_floats(k);
      std::vector<float> want(size_t(rows * stride));
      cpu->logits_topk(x.data(), rows, cols, temps, k, want.data());
      auto out = poisoned(*gpu, want.size());
      gpu->logits_topk(xd.get(), rows, cols, temps, k, out.get());
      std::vector<float> got = to_host(*gpu, out.get(), want.size());
      for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE(r);
        LogitCandidates g = read_logit_candidates(got.data() + r * stride, k, cols);
        LogitCandidates w = read_logit_candidates(want.data() + r * stride, k, cols);
        EXPECT_EQ(g.max, w.max);
        EXPECT_EQ(g.tokens, w.tokens);
        EXPECT_EQ(g.logits, w.logits);
        EXPECT_NEAR(g.sum_exp, w.sum_exp, 1e-5 * w.sum_exp);
        EXPECT_NEAR(g.sum_exp_t, w.sum_exp_t, 1e-5 * w.sum_exp_t);
      }
    }
  }
}

TEST_F(CudaOps, CausalConvCarriesStateAcrossChunks) {
  const int64_t C = 300;
  const int K = 4;
  auto w = random_vector(size_t(C * K), 30);
  std::vector<float> cpu_state(size_t(C * (K - 1)), 0.0f);
  CacheMemory& mem = *gpu->cache_memory();
  float* gpu_state = mem.allocate_cache(cpu_state.size());
  int64_t seed = 31;
  for (int64_t T : {130, 1, 2, 70, 1}) {  // multi-block, shorter than the history, and decode steps
    auto x = random_vector(size_t(T * C), uint32_t(seed++));
    std::vector<float> ref(x.size());
    cpu->causal_conv1d_silu(x.data(), T, C, w.data(), K, cpu_state.data(), ref.data());
    auto xd = to_device(*gpu, x);
    auto out = poisoned(*gpu, x.size());
    gpu->causal_conv1d_silu(xd.get(), T, C, w.data(), K, gpu_state, out.get());
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), kExact) << "T=" << T;
    EXPECT_LT(rel_error(to_host(*gpu, gpu_state, cpu_state.size()), cpu_state), kExact)
        << "state after T=" << T;
  }
  mem.free_cache(gpu_state);
}

TEST_F(CudaOps, GatedDeltaRuleMatchesCpuAcrossChunks) {
  for (DeltaRuleShape s : {DeltaRuleShape{2, 4, 16, 16}, DeltaRuleShape{16, 32, 128, 128}}) {
    const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, C = 2 * key_dim + int64_t(s.v_heads) * s.v_dim;
    const size_t state_n = size_t(s.v_heads) * s.k_dim * s.v_dim;
    auto cpu_state = random_vector(state_n, 40, 0.1f);
    float* gpu_state = gpu->cache_memory()->allocate_cache(state_n);
    gpu->upload(cpu_state.data(), gpu_state, state_n);
    uint32_t seed = 41;
    for (int64_t T : {40, 1, 1, 17}) {  // chunked and recurrent forms on the CPU
      auto qkv = random_vector(size_t(T * C), seed++);
      auto b = random_vector(size_t(T * s.v_heads), seed++), a = random_vector(size_t(T * s.v_heads), seed++);
      std::vector<float> beta(b.size()), g(b.size());
      for (size_t i = 0; i < b.size(); ++i)
        beta[i] = float(testing::sigmoid(b[i])), g[i] = -std::abs(a[i]) * 0.3f;
      std::vector<float> ref(size_t(T * s.v_heads * s.v_dim));
      cpu->gated_delta_rule(s, qkv.data(), qkv.data() + key_dim, C, qkv.data() + 2 * key_dim, C, g.data(),
                            beta.data(), T, cpu_state.data(), ref.data());
      auto qd = to_device(*gpu, qkv), gd = to_device(*gpu, g), bd = to_device(*gpu, beta);
      auto out = poisoned(*gpu, ref.size());
      gpu->gated_delta_rule(s, qd.get(), qd.get() + key_dim, C, qd.get() + 2 * key_dim, C, gd.get(), bd.get(),
                            T, gpu_state, out.get());
      EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), 1e-4) << "dk=" << s.k_dim << " T=" << T;
      EXPECT_LT(rel_error(to_host(*gpu, gpu_state, state_n), cpu_state), 1e-4) << "state dk=" << s.k_dim;
    }
    gpu->cache_memory()->free_cache(gpu_state);
  }
}

TEST_F(CudaOps, GdnDecodeMatchesComposedOpsOverSteps) {
  std::deque<std::vector<float>> keep;  // weight vectors outlive the backend's copies of them
  for (DeltaRuleShape s :
       {DeltaRuleShape{2, 4, 16, 16}, DeltaRuleShape{16, 32, 128, 128}, DeltaRuleShape{2, 4, 64, 96}}) {
    const int K = 4;
    const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, value_dim = int64_t(s.v_heads) * s.v_dim;
    const int64_t C = 2 * key_dim + value_dim;
    const size_t conv_n = size_t(C * (K - 1)), rec_n = size_t(s.v_heads) * s.k_dim * s.v_dim;
    auto& conv_w = keep.emplace_back(random_vector(size_t(C * K), 50));
    auto& a_log = keep.emplace_back(random_vector(size_t(s.v_heads), 51, 0.5f));
    auto& dt_bias = keep.emplace_back(random_vector(size_t(s.v_heads), 52));
    auto& norm_w = keep.emplace_back(random_vector(size_t(s.v_dim), 53, 0.1f));
    // 64 sequences of 128 x 128 heads take the staged kernel, 3 the register one.
    const auto batches = s.k_dim == 128 ? std::vector<int64_t>{3, 64} : std::vector<int64_t>{3};
    for (int64_t n : batches) {
      // Sequence i lives in slot order[i] of the GPU's state arrays (not the batch order).
      std::vector<int> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int((i + 2) % n);
      std::vector<std::vector<float>> cpu_conv, cpu_rec;
      float* gconv = gpu->cache_memory()->allocate_cache(conv_n * n);
      float* grec = gpu->cache_memory()->allocate_cache(rec_n * n);
      for (int64_t i = 0; i < n; ++i) {
        cpu_conv.push_back(random_vector(conv_n, uint32_t(54 + i), 0.5f));
        cpu_rec.push_back(random_vector(rec_n, uint32_t(57 + i), 0.1f));
        gpu->upload(cpu_conv.back().data(), gconv + order[size_t(i)] * conv_n, conv_n);
        gpu->upload(cpu_rec.back().data(), grec + order[size_t(i)] * rec_n, rec_n);
      }
      uint32_t seed = 60;
      for (int step = 0; step < 3; ++step) {
        auto qkv = random_vector(size_t(n * C), seed++), z = random_vector(size_t(n * value_dim), seed++);
        auto b = random_vector(size_t(n * s.v_heads), seed++),
             a = random_vector(size_t(n * s.v_heads), seed++);
        std::vector<float*> cc, cr, gc, gr;
        for (int64_t i = 0; i < n; ++i) {
          cc.push_back(cpu_conv[size_t(i)].data()), cr.push_back(cpu_rec[size_t(i)].data());
          gc.push_back(gconv + order[size_t(i)] * conv_n), gr.push_back(grec + order[size_t(i)] * rec_n);
        }
        std::vector<float> ref(size_t(n * value_dim));
        cpu->gdn_decode(s, qkv.data(), z.data(), b.data(), a.data(), n, conv_w.data(), K, a_log.data(),
                        dt_bias.data(), norm_w.data(), 1e-6f, cc, cr, ref.data());
        auto qd = to_device(*gpu, qkv), zd = to_device(*gpu, z), bd = to_device(*gpu, b),
             ad = to_device(*gpu, a);
        auto out = poisoned(*gpu, ref.size());
        gpu->gdn_decode(s, qd.get(), zd.get(), bd.get(), ad.get(), n, conv_w.data(), K, a_log.data(),
                        dt_bias.data(), norm_w.data(), 1e-6f, gc, gr, out.get());
        EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), 1e-4)
            << "dk=" << s.k_dim << " dv=" << s.v_dim << " step " << step;
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_LT(rel_error(to_host(*gpu, gc[size_t(i)], conv_n), cpu_conv[size_t(i)]), kExact)
              << "conv state";
          EXPECT_LT(rel_error(to_host(*gpu, gr[size_t(i)], rec_n), cpu_rec[size_t(i)]), 1e-4) << "state";
        }
      }
      gpu->cache_memory()->free_cache(gconv);
      gpu->cache_memory()->free_cache(grec);
    }
  }
}

// A one-layer KV cache spec of `dtype`; FP8 with scales other than 1 (K codes are halves, V codes doubles).
KvCacheSpec kv_spec(DType dtype, int kv_heads, int hd, int page_size, int64_t pages, CacheMemory* memory) {
  KvCacheSpec s;
  s.num_layers = 1, s.num_kv_heads = kv_heads, s.head_dim = hd, s.page_size = page_size, s.num_pages = pages;
  s.memory = memory, s.dtype = dtype;
  if (dtype == DType::F8_E4M3) s.k_scales = {0.5f}, s.v_scales = {2.0f};
  return s;
}

// Every KV dtype: the GPU writes the very bytes the CPU writes (the same rounding), and reads them back as
// the CPU does. The float32 kernel (fp32 mode; chunks of fewer than 128 query rows or head_dim 32 in bf16
// mode) widens the stored elements in registers and holds the exact bound; prefill chunks of 128 rows or more
// in bf16 mode run on tensor cores (Q, K, V and the probabilities rounded to bf16) and hold kBf16, split-K
// (few row blocks, spare capacity) and continuation over cached pages included.
TEST_F(CudaOps, PagedAttentionPrefillDecodeAndSplitK) {
  struct Case {
    int heads, kv_heads, hd;
    std::vector<int64_t> chunks;
  };
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3})
    for (const Case& c :
         {Case{4, 2, 32, {45, 1, 1, 20}}, Case{2, 1, 256, {70, 1, 33}}, Case{16, 2, 256, {300, 1, 1}},
          Case{8, 8, 64, {5, 1}}, Case{8, 1, 128, {130, 64, 1}}, Case{4, 4, 64, {200, 17}}})
      for (Backend* be : {gpu32.get(), gpu.get()}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (be == gpu32.get() ? " fp32" : " bf16"));
        const int page_size = 16;
        const int64_t total = std::accumulate(c.chunks.begin(), c.chunks.end(), int64_t(0));
        const int64_t num_pages = (total + page_size - 1) / page_size + 40;  // spare capacity: more split-K
        std::vector<int32_t> pages(static_cast<size_t>(num_pages));
        std::iota(pages.begin(), pages.end(), 0);
        std::reverse(pages.begin(), pages.end());
        KvCache cpu_kv(kv_spec(dtype, c.kv_heads, c.hd, page_size, num_pages, nullptr));
        KvCache gpu_kv(kv_spec(dtype, c.kv_heads, c.hd, page_size, num_pages, be->cache_memory()));
        int64_t pos = 0;
        uint32_t seed = 50;
        for (int64_t T : c.chunks) {
          auto q = random_vector(size_t(T * c.heads * c.hd), seed++),
               k = random_vector(size_t(T * c.kv_heads * c.hd), seed++),
               v = random_vector(size_t(T * c.kv_heads * c.hd), seed++);
          std::vector<float> ref(q.size());
          cpu->paged_attention(q.data(), k.data(), v.data(), T, c.heads, c.kv_heads, c.hd, pos, pages, cpu_kv,
                               0, ref.data());
          auto qd = to_device(*be, q), kd = to_device(*be, k), vd = to_device(*be, v);
          auto out = poisoned(*be, q.size());
          be->paged_attention(qd.get(), kd.get(), vd.get(), T, c.heads, c.kv_heads, c.hd, pos, pages, gpu_kv,
                              0, out.get());
          const bool tensor_cores = be == gpu.get() && c.hd >= 64 && T * (c.heads / c.kv_heads) >= 128;
          EXPECT_LT(rel_error(to_host(*be, out.get(), ref.size()), ref), tensor_cores ? kBf16 : 1e-4)
              << c.heads << "/" << c.kv_heads << " hd " << c.hd << " T=" << T << " at " << pos;
          pos += T;
        }
        const size_t floats = size_t(num_pages * cpu_kv.spec().layer_page_bytes() / 4);
        for (bool keys : {true, false}) {
          const auto* want =
              static_cast<const float*>(keys ? cpu_kv.key_data(0, 0) : cpu_kv.value_data(0, 0));
          const auto* device =
              static_cast<const float*>(keys ? gpu_kv.key_data(0, 0) : gpu_kv.value_data(0, 0));
          const auto got = to_host(*be, device, floats);
          EXPECT_EQ(std::memcmp(got.data(), want, floats * 4), 0) << (keys ? "K" : "V") << " pages differ";
        }
      }
}

TEST_F(CudaOps, AttentionDecodeMatchesComposedOps) {
  struct Case {
    int heads, kv_heads, hd, rotary;
  };
  // Weight vectors live for the whole test: the backend keys its device copies by host address.
  std::deque<std::vector<float>> keep;
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3})
    // Groups of 8 (Qwen3.5-35B-A3B), 16 (two query rows per warp of the decode kernel), 2 and 1; 256 KV
    // heads make 768 blocks, which the decode kernel runs unsplit.
    for (const Case& c : {Case{16, 2, 256, 64}, Case{32, 2, 128, 32}, Case{4, 2, 32, 16}, Case{8, 8, 64, 64},
                          Case{256, 256, 32, 16}})
      for (Backend* gpu : {gpu32.get(), this->gpu.get()}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (gpu == gpu32.get() ? " fp32" : " bf16"));
        // The decode prologue's norm and RoPE may differ from the CPU's in the last bit, which can round a
        // stored element the other way: a bf16 step is 2^-8 of it, an FP8 step 2^-3. In bf16 mode head_dim
        // 64..256 runs on tensor cores (Q and the probabilities rounded to bf16).
        const bool tensor_cores = gpu != gpu32.get() && c.hd >= 64;
        const double bound = tensor_cores           ? kBf16
                             : dtype == DType::F32  ? 1e-4
                             : dtype == DType::BF16 ? 4e-3
                                                    : 3e-2;
        const int page_size = 16;
        // Three sequences with prompts of different lengths and page tables of different sizes.
        const std::vector<int64_t> prompt = {40, 1, 100};
        const std::vector<int64_t> table_pages = {5, 2, 12};
        const int64_t num_pages = 19;
        KvCache cpu_kv(kv_spec(dtype, c.kv_heads, c.hd, page_size, num_pages, nullptr));
        KvCache gpu_kv(kv_spec(dtype, c.kv_heads, c.hd, page_size, num_pages, gpu->cache_memory()));
        std::vector<std::vector<int32_t>> tables;
        int32_t next = 0;
        for (int64_t p : table_pages) {
          auto& t = tables.emplace_back();
          for (int64_t i = 0; i < p; ++i) t.push_back(next++);
          std::reverse(t.begin(), t.end());
        }
        auto& q_norm = keep.emplace_back(random_vector(size_t(c.hd), 70, 0.1f));
        auto& k_norm = keep.emplace_back(random_vector(size_t(c.hd), 71, 0.1f));
        auto& inv_freq = keep.emplace_back();
        for (int j = 0; j < c.rotary / 2; ++j) inv_freq.push_back(float(std::pow(1e7, -2.0 * j / c.rotary)));
        uint32_t seed = 72;
        for (size_t i = 0; i < prompt.size(); ++i) {  // fill the caches with the prompts
          const int64_t T = prompt[i];
          auto q = random_vector(size_t(T * c.heads * c.hd), seed++),
               k = random_vector(size_t(T * c.kv_heads * c.hd), seed++),
               v = random_vector(size_t(T * c.kv_heads * c.hd), seed++);
          std::vector<float> out(q.size());
          cpu->paged_attention(q.data(), k.data(), v.data(), T, c.heads, c.kv_heads, c.hd, 0, tables[i],
                               cpu_kv, 0, out.data());
          auto qd = to_device(*gpu, q), kd = to_device(*gpu, k), vd = to_device(*gpu, v);
          auto od = poisoned(*gpu, q.size());
          gpu->paged_attention(qd.get(), kd.get(), vd.get(), T, c.heads, c.kv_heads, c.hd, 0, tables[i],
                               gpu_kv, 0, od.get());
        }
        std::vector<int64_t> positions = prompt;
        // M-RoPE offsets (rope_delta: text after an image rotates behind its cache index), one sequence
        // without.
        const std::vector<int64_t> offsets = {-5, 0, -37};
        const int64_t n = int64_t(prompt.size());
        std::vector<std::span<const int32_t>> spans(tables.begin(), tables.end());
        for (int step = 0; step < 3; ++step) {
          auto qg = random_vector(size_t(n * c.heads * 2 * c.hd), seed++);
          auto k = random_vector(size_t(n * c.kv_heads * c.hd), seed++),
               v = random_vector(size_t(n * c.kv_heads * c.hd), seed++);
          std::vector<float> ref(size_t(n * c.heads * c.hd)), kc = k;
          cpu->attention_decode(qg.data(), kc.data(), v.data(), n, c.heads, c.kv_heads, c.hd, q_norm.data(),
                                k_norm.data(), 1e-6f, c.rotary, inv_freq.data(), positions, offsets, spans,
                                cpu_kv, 0, ref.data());
          auto qd = to_device(*gpu, qg), kd = to_device(*gpu, k), vd = to_device(*gpu, v);
          auto out = poisoned(*gpu, ref.size());
          gpu->attention_decode(qd.get(), kd.get(), vd.get(), n, c.heads, c.kv_heads, c.hd, q_norm.data(),
                                k_norm.data(), 1e-6f, c.rotary, inv_freq.data(), positions, offsets, spans,
                                gpu_kv, 0, out.get());
          EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), bound)
              << c.heads << "/" << c.kv_heads << " hd " << c.hd << " step " << step;
          for (auto& p : positions) ++p;
        }
      }
}

TEST_F(CudaOps, SwigluAndMoeExperts) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    struct Case {
      int E, top_k;
      int64_t hidden, inter;
      std::vector<int64_t> ns;
    };
    // 8 x 2 x 192 x 128: the SIMT items of every row count at 700 tokens; at 2,100 (4,200 pairs, 525 per
    // expert) the tensor-core path: cuBLAS's grouped GEMM for bf16 weights (from 128 pairs per expert),
    // the backend's grouped kernel with its partial 128-row down slab for FP8 (widened: 192 columns).
    // 64 x 4 x 192 x 128 at 1,200 tokens (75 pairs per expert): the backend's grouped kernel for both.
    // 16 x 4 x 256 x 128 at 40 and 100 tokens (10 and 25 pairs per expert): the MMA items of 16 and 32; at
    // 3,100 (12,400 pairs) cuBLAS for bf16 weights, the grouped kernel FP8 x FP8 for FP8 weights;
    // 256 x 8 x 2048 x 512 at 64 tokens: items of 8 (bf16 and FP8 weights alike); at 600 (4,800 pairs) FP8
    // weights take the grouped kernel where it runs on wgmma (an H100/H200), at the release's widths: 16
    // scale blocks along K, so its four-stage ring wraps around.
    for (const Case& c : {Case{16, 4, 256, 64, {1, 5, 300}}, Case{256, 8, 2048, 512, {1, 3, 64, 200, 600}},
                          Case{8, 2, 192, 128, {700, 2100}}, Case{64, 4, 192, 128, {1200}},
                          Case{16, 4, 256, 128, {40, 100, 3100}}}) {
      std::vector<SwiGlu> experts;
      for (int e = 0; e < c.E; ++e)
        experts.push_back({store.make(dt, c.inter, c.hidden, uint32_t(1000 + 3 * e), 0.05f),
                           store.make(dt, c.inter, c.hidden, uint32_t(1001 + 3 * e), 0.05f),
                           store.make(dt, c.hidden, c.inter, uint32_t(1002 + 3 * e), 0.05f)});
      for (int64_t n : c.ns) {
        auto x = random_vector(size_t(n * c.hidden), uint32_t(n + 60)),
             logits = random_vector(size_t(n * c.E), uint32_t(n + 61));
        // The CPU reference is slow at the full shape: there the float32 GPU path (checked against the CPU
        // up to 64 tokens, the batch-64 decode shape) is the reference of the tensor-core path.
        const bool cpu_ref = c.E < 256 || n <= 64;
        std::vector<float> ref(x.size());
        if (cpu_ref) {
          cpu->moe_experts(experts, logits.data(), c.top_k, true, x.data(), n, c.hidden, ref.data());
        } else {
          auto xd = to_device(*gpu32, x), ld = to_device(*gpu32, logits);
          auto out = poisoned(*gpu32, x.size());
          gpu32->moe_experts(experts, ld.get(), c.top_k, true, xd.get(), n, c.hidden, out.get());
          ref = to_host(*gpu32, out.get(), x.size());
        }
        for (Backend* be : {gpu32.get(), gpu.get()}) {
          if (!cpu_ref && be == gpu32.get()) continue;
          auto xd = to_device(*be, x), ld = to_device(*be, logits);
          auto out = poisoned(*be, x.size());
          be->moe_experts(experts, ld.get(), c.top_k, true, xd.get(), n, c.hidden, out.get());
          const bool tensor_cores =
              be == gpu.get() && n * c.top_k >= cuda_tools::moe_tensor_core_min_pairs(dt, c.hidden, c.inter);
          // The MMA work items (bf16 or FP8 weights in whole 128-column chunks, past one row per item: more
          // than 2E/8 pairs, cuda::moe_tile) round the activations to bf16 once, outside exact mode.
          const bool fp8_blocks = dt == DType::F8_E4M3 && c.hidden % 128 == 0 && c.inter % 128 == 0;
          const bool chunks = c.hidden % 128 == 0 && c.inter % 128 == 0 && (dt == DType::BF16 || fp8_blocks);
          const bool items = be == gpu.get() && chunks && n * c.top_k > 2 * c.E / 8;
          const bool bf16_activations = tensor_cores || items;
          // FP8 in whole 128x128 blocks, there and in the grouped GEMM: the activations are quantized to e4m3
          // as well (FP8 x FP8 MMA).
          const bool fp8_activations = fp8_blocks && bf16_activations;
          EXPECT_LT(rel_error(to_host(*be, out.get(), ref.size()), ref), fp8_activations    ? kFp8Activations
                                                                         : bf16_activations ? kBf16
                                                                                            : 1e-4)
              << dtype_name(dt) << " E=" << c.E << " n=" << n << (be == gpu32.get() ? " fp32" : " bf16");
        }
      }
      // The shared expert / dense MLP path (at 2048 x 512 from 9 rows gate and up share x's bf16 rounding).
      for (int64_t n : {1, 5, 40}) {
        auto x = random_vector(size_t(n * c.hidden), uint32_t(n + 70));
        std::vector<float> ref(x.size());
        cpu->swiglu(experts[0], x.data(), n, ref.data());
        for (Backend* be : {gpu32.get(), gpu.get()}) {
          auto xd = to_device(*be, x);
          auto out = poisoned(*be, x.size());
          be->swiglu(experts[0], xd.get(), n, out.get());
          EXPECT_LT(rel_error(to_host(*be, out.get(), ref.size()), ref),
                    be == gpu.get() && n > 8 ? kBf16 : 1e-4)
              << "swiglu " << dtype_name(dt) << " n=" << n;
        }
      }
    }
  }
}

// The composite ops: decode-sized batches take the fused kernels (one GEMV over several matrices; the MoE
// block's routing, experts, shared expert and combine in four launches), larger ones the composed ops.
TEST_F(CudaOps, MatmulNMatchesSeparateMatmuls) {
  // All bf16, all FP8, and an FP8 checkpoint's GDN mix (qkv and z FP8, b and a bf16: a launch per dtype).
  const DType bf = DType::BF16, f8 = DType::F8_E4M3;
  for (const auto& dts :
       {std::array{bf, bf, bf, bf}, std::array{f8, f8, f8, f8}, std::array{f8, bf, f8, bf}}) {
    const int64_t cols = 256;
    std::vector<Matrix> ws = {store.make(dts[0], 520, cols, 41), store.make(dts[1], 130, cols, 42),
                              store.make(dts[2], 32, cols, 43), store.make(dts[3], 5000, cols, 44)};
    const std::string dt = fmt::format("{}/{}/{}/{}", dtype_name(dts[0]), dtype_name(dts[1]),
                                       dtype_name(dts[2]), dtype_name(dts[3]));
    for (size_t count : {2, 3, 4})
      for (int64_t n : {1, 3, 8, 9}) {
        auto x = random_vector(size_t(n * cols), uint32_t(n + 80));
        std::vector<const Matrix*> wp;
        std::vector<std::vector<float>> refs;
        for (size_t i = 0; i < count; ++i) {
          wp.push_back(&ws[i]);
          refs.emplace_back(size_t(n * ws[i].rows));
          cpu->matmul(x.data(), n, ws[i], refs.back().data());
        }
        for (Backend* be : {gpu32.get(), gpu.get()}) {
          auto xd = to_device(*be, x);
          std::vector<Buffer> outs;
          std::vector<float*> ys;
          for (size_t i = 0; i < count; ++i)
            ys.push_back((outs.emplace_back(poisoned(*be, refs[i].size()))).get());
          be->matmul_n(xd.get(), n, wp, ys);
          const bool rounded = be == gpu.get() && n > 8;
          for (size_t i = 0; i < count; ++i)
            EXPECT_LT(rel_error(to_host(*be, ys[i], refs[i].size()), refs[i]),
                      rounded && ws[i].rows >= 512 ? kBf16 : kExact)
                << dt << " matrix " << i << " of " << count << " n=" << n;
        }
      }
  }
}

TEST_F(CudaOps, MoeBlockMatchesComposedOps) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    struct Case {
      int E, top_k;
      int64_t hidden, inter, shared_inter;
    };
    for (const Case& c : {Case{16, 4, 256, 64, 96}, Case{256, 8, 2048, 512, 512}, Case{8, 2, 256, 128, 0}}) {
      std::vector<SwiGlu> experts;
      for (int e = 0; e < c.E; ++e)
        experts.push_back({store.make(dt, c.inter, c.hidden, uint32_t(2000 + 3 * e), 0.05f),
                           store.make(dt, c.inter, c.hidden, uint32_t(2001 + 3 * e), 0.05f),
                           store.make(dt, c.hidden, c.inter, uint32_t(2002 + 3 * e), 0.05f)});
      Matrix router = store.make(DType::BF16, c.E, c.hidden, 2900, 0.1f);
      Matrix shared_gate = store.make(DType::BF16, 1, c.hidden, 2901, 0.1f);
      SwiGlu shared;
      if (c.shared_inter)
        shared = {store.make(dt, c.shared_inter, c.hidden, 2902, 0.05f),
                  store.make(dt, c.shared_inter, c.hidden, 2903, 0.05f),
                  store.make(dt, c.hidden, c.shared_inter, 2904, 0.05f)};
      const SwiGlu* sp = c.shared_inter ? &shared : nullptr;
      const Matrix* gp = c.shared_inter ? &shared_gate : nullptr;
      for (int64_t n : {1, 3, 8, 9}) {
        auto x = random_vector(size_t(n * c.hidden), uint32_t(n + 90));
        std::vector<float> ref(x.size());
        cpu->moe_block(router, experts, c.top_k, true, sp, gp, x.data(), n, c.hidden, ref.data());
        for (Backend* be : {gpu32.get(), gpu.get()}) {
          auto xd = to_device(*be, x);
          auto out = poisoned(*be, x.size());
          be->moe_block(router, experts, c.top_k, true, sp, gp, xd.get(), n, c.hidden, out.get());
          const bool rounded = be == gpu.get() && n > 8;  // the shared expert's matmuls on tensor cores
          // and the routed experts' MMA items, FP8 x FP8 for FP8 weights in 128x128 blocks
          const bool fp8_activations =
              rounded && dt == DType::F8_E4M3 && c.hidden % 128 == 0 && c.inter % 128 == 0;
          EXPECT_LT(rel_error(to_host(*be, out.get(), ref.size()), ref), fp8_activations ? kFp8Activations
                                                                         : rounded       ? kBf16
                                                                                         : 1e-4)
              << dtype_name(dt) << " E=" << c.E << " shared=" << c.shared_inter << " n=" << n
              << (be == gpu32.get() ? " fp32" : " bf16");
        }
      }
    }
  }
}

TEST_F(CudaOps, RunStepReplaysWithFreshInputs) {
  // A step with host inputs (a position, uploaded data) and a download, recorded and replayed.
  const int heads = 2, hd = 64, rot = 32;
  std::vector<float> inv_freq;
  for (int j = 0; j < rot / 2; ++j) inv_freq.push_back(float(std::pow(1e4, -2.0 * j / rot)));
  gpu->prepare(inv_freq.data(), inv_freq.size());
  for (int i = 0; i < 6; ++i) {
    const int tokens = i == 4 ? 2 : 1;  // step 4 changes shape: it must run directly, and still be right
    auto x = random_vector(size_t(tokens * heads * hd), uint32_t(80 + i)), ref = x;
    cpu->rope(ref.data(), tokens, heads, hd, rot, 10 * i + 3, inv_freq.data());
    std::vector<float> got(x.size(), NAN);
    gpu->run_step(7, [&] {
      auto d = gpu->allocate(x.size());
      gpu->upload(x.data(), d.get(), x.size());
      gpu->rope(d.get(), tokens, heads, hd, rot, 10 * i + 3, inv_freq.data());
      gpu->download(d.get(), got.data(), got.size());
    });
    EXPECT_LT(rel_error(got, ref), 1e-5) << "step " << i;
  }
}

}  // namespace
}  // namespace moeserve
