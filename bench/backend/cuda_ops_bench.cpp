// Micro-benchmarks of the CUDA backend's ops at the Qwen3.5-35B-A3B shapes, against the H200's measured
// ceilings (a device-to-device copy for bandwidth, a large bf16 GEMM for tensor-core rate; both measured here
// first). Each figure is the median over replays of a CUDA graph holding many calls, with inputs rotated so
// that repeated calls do not run out of L2. Prints one table. Arguments name the sections to run (all by
// default): gemv lm_head small_gemm moe moe_block fp8_probe grouped_probe attention gdn chain; `once` runs
// each FP8 decode op once, the experts of batches of 64, 256 and 8,192 tokens and the chunked delta rule of
// 8K tokens, for a profiler.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"
#include "common/dtype.h"
#include "common/error.h"

namespace moeserve {
namespace {

using bench::time_replays;

struct Row {
  std::string what;
  double us;
  std::string rate;
};

class OpsBench {
 public:
  OpsBench() : be_(make_backend("cuda")) {}

  // `sections` names the groups to run (gemv lm_head moe moe_block fp8_probe grouped_probe attention gdn
  // chain); empty: all. The ceilings always run: the rates are given against them.
  void run(const std::vector<std::string>& sections) {
    auto on = [&](const char* name) {
      return sections.empty() || std::find(sections.begin(), sections.end(), name) != sections.end();
    };
    std::printf("%s\n", cuda_tools::device_summary(*be_).c_str());
    ceilings();
    if (on("gemv")) gemv();
    if (on("lm_head")) lm_head_batched();
    if (on("small_gemm")) small_gemm();
    if (on("moe")) moe();
    if (on("moe_block")) moe_block();
    if (on("fp8_probe")) fp8_blockscaled_probe();
    if (on("grouped_probe")) cublas_grouped_probe();
    if (!sections.empty() && on("once")) once();  // not part of the default run
    if (on("attention")) attention();
    if (on("gdn")) gdn();
    if (on("chain")) chain();
    std::printf("\n%-58s %10s  %s\n", "op", "us/call", "rate");
    for (const auto& r : rows_) std::printf("%-58s %10.2f  %s\n", r.what.c_str(), r.us, r.rate.c_str());
  }

 private:
  float* floats(size_t n, uint64_t seed, float scale = 1.0f) {
    auto* p = static_cast<float*>(cuda_tools::allocate_device(*be_, n * sizeof(float)));
    cuda_tools::fill_random(*be_, p, DType::F32, int64_t(n), seed, scale);
    return p;
  }
  Matrix matrix(DType dt, int64_t rows, int64_t cols, uint64_t seed) {
    const size_t n = size_t(rows * cols);
    void* p = cuda_tools::allocate_device(*be_, n * dtype_size(dt));
    cuda_tools::fill_random(*be_, p, dt, int64_t(n), seed, std::sqrt(3.0f / float(cols)));
    Matrix m{dt, rows, cols, p};
    if (dt == DType::F8_E4M3) {
      m.block_rows = m.block_cols = 128;
      const int64_t blocks = (rows + 127) / 128 * m.scale_cols();
      m.scale_inv = floats(size_t(blocks), seed + 1, 0.01f);
    }
    return m;
  }
  std::string gbs(double bytes, double s) {
    return fmt::format("{:7.0f} GB/s  ({:4.1f}% of copy {:.0f})", bytes / s / 1e9, 100 * bytes / s / copy_bw_,
                       copy_bw_ / 1e9);
  }
  std::string tflops(double flops, double s) {
    return fmt::format("{:7.1f} TFLOP/s ({:4.1f}% of bf16 GEMM {:.0f})", flops / s / 1e12,
                       100 * flops / s / gemm_rate_, gemm_rate_ / 1e12);
  }
  void add(std::string what, double s, std::string rate) {
    rows_.push_back({std::move(what), s * 1e6, std::move(rate)});
  }

  void ceilings() {
    const size_t n = size_t(1) << 28;  // 1 GiB of floats
    auto src = be_->allocate(n), dst = be_->allocate(n);
    cuda_tools::fill_random(*be_, src.get(), DType::F32, int64_t(n), 1, 1.0f);
    double s = time_replays(
        *be_, [&] { be_->copy(src.get(), dst.get(), n); }, 1, key_++);
    copy_bw_ = 2.0 * n * 4 / s;
    add("ceiling: device copy 1 GiB (read + write)", s, fmt::format("{:7.0f} GB/s", copy_bw_ / 1e9));
    const int64_t N = 8192;
    Matrix w = matrix(DType::BF16, N, N, 2);
    float* x = floats(size_t(N * N), 3);
    auto y = be_->allocate(size_t(N * N));
    s = time_replays(
        *be_, [&] { be_->matmul(x, N, w, y.get()); }, 1, key_++);
    gemm_rate_ = 2.0 * N * N * N / s;
    add("ceiling: matmul 8192^3 (cuBLAS bf16, incl. rounding x)", s,
        fmt::format("{:7.1f} TFLOP/s", gemm_rate_ / 1e12));
  }

  // Matrices of few outputs (the router, the GDN b/a gates) at batched-decode and prefill sizes, float32
  // throughout: the streaming GEMV below small_sgemm_min_rows, cuBLAS's SGEMM over a float32 copy from it.
  // MOESERVE_CUDA_SMALL_SGEMM_MIN_ROWS=0 measures the GEMV at every size.
  void small_gemm() {
    for (auto [name, rows] :
         {std::pair<const char*, int64_t>{"router", 256}, {"gdn b/a", 32}, {"shared expert gate", 1}}) {
      const int64_t cols = 2048;
      Matrix w = matrix(DType::BF16, rows, cols, 30);
      for (int64_t n : {16, 32, 64, 128, 256, 1024, 8192}) {
        float* x = floats(size_t(n * cols), 31);
        auto y = be_->allocate(size_t(n * rows));
        be_->matmul(x, n, w, y.get());  // an eager first call makes the float32 copy
        const int reps = 8;
        double s = time_replays(
            *be_,
            [&] {
              for (int r = 0; r < reps; ++r) be_->matmul(x, n, w, y.get());
            },
            reps, key_++);
        add(fmt::format("small gemm {} {}x{} bf16 n={}", name, rows, cols, n), s,
            tflops(2.0 * n * rows * cols, s));
      }
    }
  }

  void gemv() {
    struct Shape {
      const char* name;
      int64_t rows, cols;
    };
    for (DType dt : {DType::BF16, DType::F8_E4M3})
      for (const Shape& sh :
           {Shape{"in_proj_qkv", 8192, 2048}, Shape{"out_proj", 2048, 4096}, Shape{"q_proj", 8192, 2048},
            Shape{"router", 256, 2048}, Shape{"lm_head", 248320, 2048}}) {
        const double bytes = double(sh.rows) * sh.cols * dtype_size(dt);
        const int copies = bytes < 256e6 ? 8 : 1;  // rotate through more than the L2
        std::vector<Matrix> ws;
        for (int i = 0; i < copies; ++i) ws.push_back(matrix(dt, sh.rows, sh.cols, 10 + i));
        // n > 8: cuBLAS at bf16; FP8 on tensor cores over the FP8 bytes up to 64 rows, widened to bf16 above.
        const bool small = std::string(sh.name) != "lm_head";
        for (int64_t n : {1, 4, 8, 16, 32, 64}) {
          if (n > 8 && !small) continue;
          float* x = floats(size_t(n * sh.cols), 20);
          auto y = be_->allocate(size_t(n * sh.rows));
          const int reps = copies * 2;
          double s = time_replays(
              *be_,
              [&] {
                for (int r = 0; r < reps; ++r) be_->matmul(x, n, ws[size_t(r % copies)], y.get());
              },
              reps, key_++);
          add(fmt::format("gemv {} {}x{} {} n={}", sh.name, sh.rows, sh.cols, dtype_name(dt), n), s,
              gbs(bytes, s));
        }
      }
  }

  // The lm_head of a decode batch (bf16, as the checkpoints keep it): one row per sequence.
  void lm_head_batched() {
    Matrix lm_head = matrix(DType::BF16, 248320, 2048, 40);
    for (int64_t n : {16, 64, 256}) {
      float* x = floats(size_t(n * lm_head.cols), 41);
      auto y = be_->allocate(size_t(n * lm_head.rows));
      double s = time_replays(
          *be_, [&] { be_->matmul(x, n, lm_head, y.get()); }, 1, key_++);
      add(fmt::format("matmul lm_head 248320x2048 BF16 n={}", n), s,
          tflops(2.0 * double(n) * lm_head.rows * lm_head.cols, s));
    }
  }

  void moe() {
    const int E = 256, k = 8;
    const int64_t H = 2048, I = 512;
    for (DType dt : {DType::BF16, DType::F8_E4M3}) {
      std::vector<SwiGlu>& experts = expert_sets_.emplace_back();
      for (int e = 0; e < E; ++e)
        experts.push_back(
            {matrix(dt, I, H, 100 + 3 * e), matrix(dt, I, H, 101 + 3 * e), matrix(dt, H, I, 102 + 3 * e)});
      const double expert_bytes = 3.0 * H * I * dtype_size(dt);
      for (int64_t n : {1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
        const int variants = n <= 64 ? 8 : 1;  // fresh routing per call
        std::vector<float*> logits;
        for (int v = 0; v < variants; ++v) logits.push_back(floats(size_t(n * E), 200 + v, 3.0f));
        float* x = floats(size_t(n * H), 30);
        auto out = be_->allocate(size_t(n * H));
        const int reps = n <= 64 ? 16 : 1;
        double s = time_replays(
            *be_,
            [&] {
              for (int r = 0; r < reps; ++r)
                be_->moe_experts(experts, logits[size_t(r % variants)], k, true, x, n, H, out.get());
            },
            reps, key_++, n >= 2048 ? 3 : 5, n >= 2048 ? 1 : 3);
        // Distinct experts a call reads, in expectation for uniform routing.
        const double touched = E * (1.0 - std::pow(1.0 - double(k) / E, double(n)));
        const double flops = 2.0 * double(n) * k * 3 * H * I;
        const std::string path =
            n * k >= cuda_tools::moe_tensor_core_min_pairs(dt, H, I) ? "grouped" : "items";
        add(fmt::format("moe E=256 top8 {} n={} ({})", dtype_name(dt), n, path), s,
            n <= 1024 ? gbs(touched * expert_bytes, s) + fmt::format(" {:.0f} experts", touched)
                      : tflops(flops, s));
      }
    }
  }

  // The decode MoE as the model runs it (Backend::moe_block): router + shared-expert gate GEMV, routing, the
  // routed experts and the sigmoid-gated shared expert; ≤ 8 tokens in 4 launches, more through the composed
  // ops. Rates count the expected distinct experts' bytes plus the shared expert's (router and gate bf16).
  void moe_block() {
    const int E = 256, k = 8;
    const int64_t H = 2048, I = 512;
    for (DType dt : {DType::BF16, DType::F8_E4M3}) {
      std::vector<SwiGlu>& experts = expert_sets_.emplace_back();
      for (int e = 0; e < E; ++e)
        experts.push_back(
            {matrix(dt, I, H, 500 + 3 * e), matrix(dt, I, H, 501 + 3 * e), matrix(dt, H, I, 502 + 3 * e)});
      const SwiGlu shared{matrix(dt, I, H, 1400), matrix(dt, I, H, 1401), matrix(dt, H, I, 1402)};
      const Matrix router = matrix(DType::BF16, E, H, 1403), gate = matrix(DType::BF16, 1, H, 1404);
      const double expert_bytes = 3.0 * H * I * dtype_size(dt);
      for (int64_t n : {1, 2, 4, 8, 16}) {
        const int variants = 8;  // fresh routing per call: different activations
        std::vector<float*> xs;
        for (int v = 0; v < variants; ++v) xs.push_back(floats(size_t(n * H), 300 + v, 3.0f));
        auto out = be_->allocate(size_t(n * H));
        const int reps = 16;
        double s = time_replays(
            *be_,
            [&] {
              for (int r = 0; r < reps; ++r)
                be_->moe_block(router, experts, k, true, &shared, &gate, xs[size_t(r % variants)], n, H,
                               out.get());
            },
            reps, key_++);
        const double touched = E * (1.0 - std::pow(1.0 - double(k) / E, double(n)));
        add(fmt::format("moe_block E=256 top8 + shared {} n={}", dtype_name(dt), n), s,
            gbs((touched + 1) * expert_bytes + 2.0 * (E + 1) * H, s) +
                fmt::format(" {:.0f} experts", touched));
      }
    }
  }

  // The experts of a prefill as cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, bf16, one group per
  // expert), the alternative issue 19 names to the backend's own grouped kernel (moe_mma.cu): gate and up as
  // one [2I][H] matrix per expert, then down (bf16 out: cuBLAS takes bf16 C with bf16 A and B here). cuBLAS
  // needs every expert's row count on the host, so this path would cost the MoE a device-to-host sync per
  // layer; measured here without it, routing uniform.
  void cublas_grouped_probe() {
    const int E = 256, k = 8;
    const int64_t H = 2048, I = 512;
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
      std::printf("cublas grouped probe: no handle\n");
      return;
    }
    auto bf16 = [&](int64_t n, uint64_t seed) {
      void* p = cuda_tools::allocate_device(*be_, size_t(n) * 2);
      cuda_tools::fill_random(*be_, p, DType::BF16, n, seed, 0.02f);
      return static_cast<char*>(p);
    };
    char* gate_up = bf16(int64_t(E) * 2 * I * H, 900);
    char* down = bf16(int64_t(E) * H * I, 901);
    for (int64_t n : {int64_t(1024), int64_t(8192)}) {
      // Uniform routing: k distinct experts per token.
      std::vector<int> rows(E, 0);
      uint64_t st = 0x9e3779b97f4a7c15ull + uint64_t(n);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int> chosen;
        while (int(chosen.size()) < k) {
          st ^= st << 13, st ^= st >> 7, st ^= st << 17;
          const int e = int(st % uint64_t(E));
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (int e : chosen) ++rows[size_t(e)];
      }
      const int64_t P = n * k;
      char* x = bf16(P * H, 902);
      char* h = bf16(P * 2 * I, 903);
      auto* y = static_cast<char*>(cuda_tools::allocate_device(*be_, size_t(P * H) * 2));
      std::vector<int> m1, n1, k1, lda1, ldb1, ldc1, m2, n2, k2, lda2, ldb2, ldc2, sizes;
      std::vector<const void*> a1, b1, a2, b2;
      std::vector<void*> c1, c2;
      std::vector<cublasOperation_t> ta, tb;
      std::vector<float> alpha, beta;
      int64_t row = 0;
      for (int e = 0; e < E; ++e) {
        const int r = rows[size_t(e)];
        if (r == 0) continue;
        // Column-major: C [N x r] = W [K x N]ᵀ · X [K x r], i.e. row-major y[r][N] = x[r][K] · W[N][K]ᵀ.
        m1.push_back(int(2 * I)), n1.push_back(r), k1.push_back(int(H));
        lda1.push_back(int(H)), ldb1.push_back(int(H)), ldc1.push_back(int(2 * I));
        a1.push_back(gate_up + int64_t(e) * 2 * I * H * 2), b1.push_back(x + row * H * 2);
        c1.push_back(h + row * 2 * I * 2);
        m2.push_back(int(H)), n2.push_back(r), k2.push_back(int(I));
        lda2.push_back(int(I)), ldb2.push_back(int(2 * I)), ldc2.push_back(int(H));
        a2.push_back(down + int64_t(e) * H * I * 2), b2.push_back(h + row * 2 * I * 2);
        c2.push_back(y + row * H * 2);
        ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N), alpha.push_back(1.0f), beta.push_back(0.0f);
        sizes.push_back(1);
        row += r;
      }
      const int groups = int(sizes.size());
      auto device_ptrs = [&](const auto& v) {
        void* d = cuda_tools::allocate_device(*be_, v.size() * sizeof(void*));
        cudaMemcpy(d, v.data(), v.size() * sizeof(void*), cudaMemcpyHostToDevice);
        return d;
      };
      auto* da1 = static_cast<const void* const*>(device_ptrs(a1));
      auto* db1 = static_cast<const void* const*>(device_ptrs(b1));
      auto* dc1 = static_cast<void* const*>(device_ptrs(c1));
      auto* da2 = static_cast<const void* const*>(device_ptrs(a2));
      auto* db2 = static_cast<const void* const*>(device_ptrs(b2));
      auto* dc2 = static_cast<void* const*>(device_ptrs(c2));
      std::pair<cublasStatus_t, cublasStatus_t> status;
      auto run = [&] {
        cublasStatus_t s1 = cublasGemmGroupedBatchedEx(
            handle, ta.data(), tb.data(), m1.data(), n1.data(), k1.data(), alpha.data(), da1, CUDA_R_16BF,
            lda1.data(), db1, CUDA_R_16BF, ldb1.data(), beta.data(), dc1, CUDA_R_16BF, ldc1.data(), groups,
            sizes.data(), CUBLAS_COMPUTE_32F);
        cublasStatus_t s2 = cublasGemmGroupedBatchedEx(
            handle, ta.data(), tb.data(), m2.data(), n2.data(), k2.data(), alpha.data(), da2, CUDA_R_16BF,
            lda2.data(), db2, CUDA_R_16BF, ldb2.data(), beta.data(), dc2, CUDA_R_16BF, ldc2.data(), groups,
            sizes.data(), CUBLAS_COMPUTE_32F);
        status = {s1, s2};
        return s1 == CUBLAS_STATUS_SUCCESS && s2 == CUBLAS_STATUS_SUCCESS;
      };
      cuda_tools::synchronize(*be_);
      if (!run()) {
        std::printf("cublasGemmGroupedBatchedEx n=%lld: status %d / %d\n", (long long)n, int(status.first),
                    int(status.second));
        continue;
      }
      cudaDeviceSynchronize();
      const int iters = 10;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run();
      cudaDeviceSynchronize();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      add(fmt::format("cublas grouped bf16 experts E=256 top8 n={} (gate_up + down, no silu)", n), sec,
          tflops(2.0 * double(P) * 3 * H * I, sec));
    }
    cublasDestroy(handle);
  }

  // Does cuBLASLt's block-scaled FP8 GEMM (CUDA 12.9+: activations 1x128 VEC128_32F, weights 128x128
  // BLK128x128_32F) run on this GPU, which scale layouts does it take, and how fast is it against the bf16
  // paths? Activations are quantized on the host (per token and 128 columns, amax / 448); the result is
  // checked against the backend's own FP8 matmul. Prints one line per case.
  void fp8_blockscaled_probe() {
    const int64_t M = 8192, K = 2048;  // weight rows, columns
    Matrix w8 = matrix(DType::F8_E4M3, M, K, 700), w16 = matrix(DType::BF16, M, K, 701);
    cublasLtHandle_t lt = nullptr;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
      std::printf("cublasLt probe: no handle\n");
      return;
    }
    void* workspace = cuda_tools::allocate_device(*be_, size_t(64) << 20);
    for (int64_t n : {int64_t(256), int64_t(1024), int64_t(8192)}) {
      const int64_t kb = K / 128;
      std::vector<float> x(size_t(n * K));
      uint64_t st = 0x12345678u + uint64_t(n);
      for (auto& v : x) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        v = float(int64_t(st >> 40) - (int64_t(1) << 23)) / float(1 << 23);
      }
      std::vector<uint8_t> xq(x.size());
      std::vector<float> sx_tok_major(size_t(n * kb)), sx_outer_major(size_t(n * kb));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < kb; ++b) {
          float amax = 0.0f;
          for (int64_t c = 0; c < 128; ++c) amax = std::max(amax, std::abs(x[size_t(t * K + b * 128 + c)]));
          const float sc = amax > 0 ? amax / 448.0f : 1.0f;
          for (int64_t c = 0; c < 128; ++c)
            xq[size_t(t * K + b * 128 + c)] = f32_to_fp8_e4m3(x[size_t(t * K + b * 128 + c)] / sc);
          sx_tok_major[size_t(t * kb + b)] = sc, sx_outer_major[size_t(b * n + t)] = sc;
        }
      auto* xq_d = static_cast<uint8_t*>(cuda_tools::allocate_device(*be_, xq.size()));
      auto* sx_d = static_cast<float*>(cuda_tools::allocate_device(*be_, sx_tok_major.size() * 4));
      auto* y_d = static_cast<float*>(cuda_tools::allocate_device(*be_, size_t(n * M) * 4));
      float* xf = floats(size_t(n * K), 1);  // the same x in float32 for the reference
      be_->upload(x.data(), xf, x.size());
      cuda_tools::synchronize(*be_);
      cudaMemcpy(xq_d, xq.data(), xq.size(), cudaMemcpyHostToDevice);
      auto ref = be_->allocate(size_t(n * M));
      be_->matmul(xf, n, w8, ref.get());  // the backend's FP8 path
      std::vector<float> want(size_t(n * M)), got(size_t(n * M));
      be_->download(ref.get(), want.data(), want.size());
      // Weight scales: ours are [M/128][K/128] (column blocks contiguous); also try the transpose.
      const int64_t mb = M / 128;
      std::vector<float> sw(size_t(mb * kb)), sw_t(size_t(mb * kb));
      cudaMemcpy(sw.data(), w8.scale_inv, sw.size() * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < kb; ++j) sw_t[size_t(j * mb + i)] = sw[size_t(i * kb + j)];
      auto* sw_d = static_cast<float*>(cuda_tools::allocate_device(*be_, sw.size() * 4));
      bool reported = false;
      for (int layout = 0; layout < 4 && !reported; ++layout) {
        const bool x_outer = layout & 1, w_t = layout & 2;
        cudaMemcpy(sx_d, (x_outer ? sx_outer_major : sx_tok_major).data(), sx_tok_major.size() * 4,
                   cudaMemcpyHostToDevice);
        cudaMemcpy(sw_d, (w_t ? sw_t : sw).data(), sw.size() * 4, cudaMemcpyHostToDevice);
        // D (M x n, column-major: y[t][r]) = op(A) op(B): A = weights stored K-contiguous (OP_T), B = x
        // (OP_N).
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulPreference_t pref = nullptr;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN));
        const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode));
        const void* sa = sw_d;
        const void* sb = sx_d;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
        cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), K);
        cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(n), K);
        cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, uint64_t(M), uint64_t(n), M);
        cublasLtMatmulPreferenceCreate(&pref);
        const size_t ws = size_t(64) << 20;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
        cublasLtMatmulHeuristicResult_t heur{};
        int found = 0;
        const cublasStatus_t hs =
            cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, 1, &heur, &found);
        if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
          std::printf("cublasLt FP8 block-scaled n=%lld: no algorithm (status %d, %d found)\n", (long long)n,
                      int(hs), found);
          reported = true;
        } else {
          const float one = 1.0f, zero = 0.0f;
          auto run = [&] {
            return cublasLtMatmul(lt, desc, &one, w8.data, a, xq_d, b, &zero, y_d, c, y_d, c, &heur.algo,
                                  workspace, ws, nullptr);
          };
          const cublasStatus_t rs = run();
          cudaDeviceSynchronize();
          cudaMemcpy(got.data(), y_d, got.size() * 4, cudaMemcpyDeviceToHost);
          double num = 0, den = 0;
          for (size_t i = 0; i < got.size(); ++i)
            num += double(got[i] - want[i]) * (got[i] - want[i]), den += double(want[i]) * want[i];
          const double err = std::sqrt(num / std::max(den, 1e-30));
          if (rs == CUBLAS_STATUS_SUCCESS && err < 0.1) {
            cudaDeviceSynchronize();
            const int iters = 20;
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; ++i) run();
            cudaDeviceSynchronize();
            const double sec =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
            add(fmt::format("cublasLt fp8 blk128x128 x vec128 {}x{} n={} (x scales {}, w scales {})", M, K, n,
                            x_outer ? "k-block major" : "token major", w_t ? "transposed" : "as stored"),
                sec, tflops(2.0 * M * K * n, sec) + fmt::format(" rel err {:.3f} vs the backend", err));
            reported = true;
          } else if (layout == 3) {
            std::printf("cublasLt FP8 block-scaled n=%lld: status %d, rel err %.3f in every scale layout\n",
                        (long long)n, int(rs), err);
          }
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(c);
        cublasLtMatmulDescDestroy(desc);
      }
      // The two bf16 paths at the same shape: cuBLAS over bf16 weights, and FP8 widened first.
      auto y2 = be_->allocate(size_t(n * M));
      double s16 = time_replays(
          *be_, [&] { be_->matmul(xf, n, w16, y2.get()); }, 1, key_++);
      add(fmt::format("matmul {}x{} bf16 n={} (cuBLAS)", M, K, n), s16, tflops(2.0 * M * K * n, s16));
      double s8 = time_replays(
          *be_, [&] { be_->matmul(xf, n, w8, y2.get()); }, 1, key_++);
      add(fmt::format("matmul {}x{} fp8 n={} (the backend's FP8 path)", M, K, n), s8,
          tflops(2.0 * M * K * n, s8));
    }
    cublasLtDestroy(lt);
  }

  // Each FP8 decode op once, eagerly (no graph), for a kernel profiler: `ncu cuda_ops_bench once`.
  void once() {
    const int E = 256, k = 8;
    const int64_t H = 2048, I = 512;
    const DType dt = DType::F8_E4M3;
    std::vector<SwiGlu>& experts = expert_sets_.emplace_back();
    for (int e = 0; e < E; ++e)
      experts.push_back(
          {matrix(dt, I, H, 900 + 3 * e), matrix(dt, I, H, 901 + 3 * e), matrix(dt, H, I, 902 + 3 * e)});
    const SwiGlu shared{matrix(dt, I, H, 1900), matrix(dt, I, H, 1901), matrix(dt, H, I, 1902)};
    const Matrix router = matrix(DType::BF16, E, H, 1903), gate = matrix(DType::BF16, 1, H, 1904);
    const Matrix w1 = matrix(dt, 8192, 2048, 1905), w2 = matrix(dt, 2048, 4096, 1906);
    for (int64_t n : {1, 8, 16}) {
      float* x = floats(size_t(n * 4096), 1907, 1.0f);
      auto y = be_->allocate(size_t(n * 8192));
      be_->matmul(x, n, w1, y.get());
      be_->matmul(x, n, w2, y.get());
      be_->moe_block(router, experts, k, true, &shared, &gate, x, n, H, y.get());
      cuda_tools::synchronize(*be_);
    }
    // The routed experts of mid-size batches (work items of 8 and 16 rows), FP8 and bf16 weights.
    std::vector<SwiGlu>& bf16_experts = expert_sets_.emplace_back();
    for (int e = 0; e < E; ++e)
      bf16_experts.push_back({matrix(DType::BF16, I, H, 2000 + 3 * e),
                              matrix(DType::BF16, I, H, 2001 + 3 * e),
                              matrix(DType::BF16, H, I, 2002 + 3 * e)});
    for (const std::vector<SwiGlu>* set : {&experts, &bf16_experts})
      for (int64_t n : {64, 256, 8192}) {
        float* x = floats(size_t(n * H), 2900, 1.0f);
        float* logits = floats(size_t(n * E), 2901, 3.0f);
        auto y = be_->allocate(size_t(n * H));
        be_->moe_experts(*set, logits, k, true, x, n, H, y.get());
        cuda_tools::synchronize(*be_);
      }
    // The chunked delta rule of an 8K-token prefill at 35B-A3B's GDN heads.
    const DeltaRuleShape sh{16, 32, 128, 128};
    const int64_t T = 8192, C = 8192, key_dim = 2048;
    float* state = be_->cache_memory()->allocate_cache(size_t(32 * 128 * 128));
    float* qkv = floats(size_t(T * C), 50);
    float* g = floats(size_t(T * 32), 51, 0.1f);
    float* beta = floats(size_t(T * 32), 52, 0.5f);
    auto out = be_->allocate(size_t(T * 32 * 128));
    be_->gated_delta_rule(sh, qkv, qkv + key_dim, C, qkv + 2 * key_dim, C, g, beta, T, state, out.get());
    cuda_tools::synchronize(*be_);
  }

  // The cost of one more dependent kernel in a decode step's graph: chains of ops, each reading what the one
  // before wrote, replayed as one graph (programmatic dependent launch, as in decode). A batch-1 FP8 step is
  // ~460 such nodes; the tiny ops give the per-node floor, the 1-row FP8 matmuls (64 distinct 2048x2048
  // matrices, 256 MB, past L2) that floor plus streaming 4 MB.
  void chain() {
    const int64_t H = 2048;
    const int len = 256;
    float* a = floats(size_t(H), 60);
    float* b = floats(size_t(H), 61, 1e-3f);
    float* w = floats(size_t(H), 62);
    float* out = floats(size_t(H), 63);
    double s = time_replays(
        *be_,
        [&] {
          for (int i = 0; i < len; ++i) be_->add(a, b, size_t(H));
        },
        len, key_++);
    add(fmt::format("chain of {} add (1 x 2048, a += b)", len), s, "per node");
    s = time_replays(
        *be_,
        [&] {
          for (int i = 0; i < len; ++i) be_->add_rms_norm(a, b, 1, H, w, 1e-6f, out);
        },
        len, key_++);
    add(fmt::format("chain of {} add_rms_norm (1 x 2048)", len), s, "per node");
    std::vector<Matrix> ws;
    for (int i = 0; i < 64; ++i) ws.push_back(matrix(DType::F8_E4M3, H, H, 3000 + i));
    s = time_replays(
        *be_,
        [&] {
          for (int i = 0; i < len; ++i) be_->matmul(i % 2 ? out : a, 1, ws[size_t(i % 64)], i % 2 ? a : out);
        },
        len, key_++);
    add(fmt::format("chain of {} FP8 matmuls 2048x2048, 1 row (x -> y -> x)", len), s,
        gbs(double(H * H), s) + " per node");
  }

  // Per KV cache dtype: decode streams the stored bytes (bandwidth counts them), prefill is compute-bound.
  // bf16 and FP8 pages stay zero: the kernels' work does not depend on the values.
  void attention() {
    const int heads = 16, kvh = 2, hd = 256, page_size = 16;
    for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3}) {
      const std::string kv_name(kv_cache_dtype_name(dtype));
      auto spec = [&](int64_t pages_n) {
        KvCacheSpec s;
        s.num_layers = 1, s.num_kv_heads = kvh, s.head_dim = hd, s.page_size = page_size;
        s.num_pages = pages_n, s.memory = be_->cache_memory(), s.dtype = dtype;
        return s;
      };
      for (int64_t ctx : {4096, 32768}) {
        const int64_t pages_n = ctx / page_size + 1;
        KvCache kv(spec(pages_n));
        if (dtype == DType::F32) {
          const size_t kv_floats = size_t(pages_n * page_size * kvh * hd);
          cuda_tools::fill_random(*be_, kv.keys(0, 0), DType::F32, int64_t(kv_floats), 40, 1.0f);
          cuda_tools::fill_random(*be_, kv.values(0, 0), DType::F32, int64_t(kv_floats), 41, 1.0f);
        }
        std::vector<int32_t> pages(static_cast<size_t>(pages_n));
        std::iota(pages.begin(), pages.end(), 0);
        float* q = floats(size_t(heads * hd), 42);
        float* kn = floats(size_t(kvh * hd), 43);
        auto out = be_->allocate(size_t(heads * hd));
        const int reps = 8;
        double s = time_replays(
            *be_,
            [&] {
              for (int r = 0; r < reps; ++r)
                be_->paged_attention(q, kn, kn, 1, heads, kvh, hd, ctx - 1, pages, kv, 0, out.get());
            },
            reps, key_++);
        add(fmt::format("attention decode ctx={} ({} KV, split-K)", ctx, kv_name), s,
            gbs(double(ctx) * kv.spec().bytes_per_token(), s));
      }
      for (int64_t T : {1024, 8192}) {
        const int64_t pages_n = T / page_size + 1;
        KvCache kv(spec(pages_n));
        std::vector<int32_t> pages(static_cast<size_t>(pages_n));
        std::iota(pages.begin(), pages.end(), 0);
        float* q = floats(size_t(T * heads * hd), 44);
        float* kn = floats(size_t(T * kvh * hd), 45);
        auto out = be_->allocate(size_t(T * heads * hd));
        for (bool tc : {false, true}) {
          setenv("MOESERVE_CUDA_ATTENTION_TC", tc ? "1" : "0", 1);
          double s = bench::time_direct(
              *be_, [&] { be_->paged_attention(q, kn, kn, T, heads, kvh, hd, 0, pages, kv, 0, out.get()); });
          add(fmt::format("attention prefill T={} ({} KV, {})", T, kv_name, tc ? "bf16 mma" : "fp32 SIMT"), s,
              tflops(4.0 * heads * hd * T * (T + 1) / 2, s));
        }
        unsetenv("MOESERVE_CUDA_ATTENTION_TC");
      }
    }
  }

  // The GDN at the 35B-A3B shape (16 key heads, 32 value heads of 128 x 128). Decode with a float32 and a
  // bf16 state slot; prefill with the recurrent and the chunked delta rule at each length
  // (MOESERVE_CUDA_GDN_CHUNKED_MIN picks the form; the default crossover is the backend's).
  void gdn() {
    const DeltaRuleShape sh{16, 32, 128, 128};
    const int64_t C = 8192, key_dim = 2048;
    const size_t state_n = size_t(32 * 128 * 128);
    float* state = be_->cache_memory()->allocate_cache(state_n);
    float* state16 = reinterpret_cast<float*>(be_->cache_memory()->allocate_cache_bf16(state_n));
    float* conv_state = be_->cache_memory()->allocate_cache(size_t(C * 3));
    std::vector<float> w(size_t(C * 4), 0.1f);
    be_->prepare(w.data(), w.size());
    for (int64_t T : {1, 16, 32, 64, 128, 256, 1024, 8192}) {
      float* qkv = floats(size_t(T * C), 50);
      float* g = floats(size_t(T * 32), 51, 0.1f);
      float* beta = floats(size_t(T * 32), 52, 0.5f);
      auto out = be_->allocate(size_t(T * 32 * 128)), conv_out = be_->allocate(size_t(T * C));
      const int reps = T == 1 ? 16 : 1;
      auto delta_on = [&](float* st) {
        return [&, st] {
          for (int r = 0; r < reps; ++r)
            be_->gated_delta_rule(sh, qkv, qkv + key_dim, C, qkv + 2 * key_dim, C, g, beta, T, st, out.get());
        };
      };
      auto conv = [&] {
        for (int r = 0; r < reps; ++r)
          be_->causal_conv1d_silu(qkv, T, C, w.data(), 4, conv_state, conv_out.get());
      };
      if (T == 1) {
        double s = time_replays(*be_, delta_on(state), reps, key_++);
        add("gated delta rule decode (32 heads, fp32 state)", s, gbs(2.0 * state_n * 4, s));
        s = time_replays(*be_, delta_on(state16), reps, key_++);
        add("gated delta rule decode (32 heads, bf16 state)", s, gbs(2.0 * state_n * 2, s));
        s = time_replays(*be_, conv, reps, key_++);
        add("causal conv1d decode (8192 channels)", s, gbs(2.0 * T * C * 4, s));
        continue;
      }
      // The chunked form's products per chunk and value head: K Kᵀ, Q Kᵀ (64x64x128), W and U (64x64x256),
      // then W S, (γQ) S, Kᵀ δ (64x128x128) and P δ (64x64x128).
      const double chunked_flops =
          double((T + 63) / 64) * 32 * 2.0 * 64 * (64 * 128 * 3 + 64 * 256 + 128 * 128 * 3);
      for (const char* form : {"recurrent", "chunked"}) {
        const bool chunked = form[0] == 'c';
        setenv("MOESERVE_CUDA_GDN_CHUNKED_MIN", chunked ? "1" : "1000000000", 1);
        const double s = bench::time_direct(*be_, delta_on(state));
        add(fmt::format("gated delta rule prefill T={} ({})", T, form), s,
            chunked ? fmt::format("{:8.0f} tok/s, {:.1f} TFLOP/s", T / s, chunked_flops / s * 1e-12)
                    : fmt::format("{:8.0f} tok/s", T / s));
      }
      unsetenv("MOESERVE_CUDA_GDN_CHUNKED_MIN");
      if (T >= 1024) {
        const double s = bench::time_direct(*be_, conv);
        add(fmt::format("causal conv1d prefill T={}", T), s, gbs(2.0 * T * C * 4, s));
      }
    }
    gdn_decode(sh, C);
  }

  // The batched decode core (conv + gates + delta rule + gated norm over each sequence's slot), float32 and
  // bf16 slots; the rate counts the state read and written.
  void gdn_decode(const DeltaRuleShape& sh, int64_t C) {
    const int64_t conv_n = C * 3, rec_n = int64_t(sh.v_heads) * sh.k_dim * sh.v_dim;
    std::deque<std::vector<float>> host;  // weight vectors outlive the backend's copies of them
    const float* conv_w = host.emplace_back(size_t(C * 4), 0.1f).data();
    const float* a_log = host.emplace_back(size_t(sh.v_heads), 0.5f).data();
    const float* dt_bias = host.emplace_back(size_t(sh.v_heads), 0.1f).data();
    const float* norm_w = host.emplace_back(size_t(sh.v_dim), 1.0f).data();
    for (int64_t n : {1, 16, 32, 64, 256}) {
      float* qkv = floats(size_t(n * C), 60);
      float* z = floats(size_t(n * sh.v_heads * sh.v_dim), 61);
      float* b = floats(size_t(n * sh.v_heads), 62);
      float* a = floats(size_t(n * sh.v_heads), 63);
      auto out = be_->allocate(size_t(n * sh.v_heads * sh.v_dim));
      for (bool bf16 : {false, true}) {
        CacheMemory& mem = *be_->cache_memory();
        const size_t slot = size_t(conv_n + rec_n);
        float* pool = bf16 ? reinterpret_cast<float*>(mem.allocate_cache_bf16(size_t(n) * slot))
                           : mem.allocate_cache(size_t(n) * slot);
        std::vector<float*> convs, recs;
        for (int64_t i = 0; i < n; ++i) {  // each sequence's slot: conv state, then recurrent state
          const size_t at = size_t(i) * slot;
          convs.push_back(bf16 ? reinterpret_cast<float*>(reinterpret_cast<uint16_t*>(pool) + at)
                               : pool + at);
          recs.push_back(bf16 ? reinterpret_cast<float*>(reinterpret_cast<uint16_t*>(pool) + at + conv_n)
                              : pool + at + conv_n);
        }
        auto step = [&] {
          be_->gdn_decode(sh, qkv, z, b, a, n, conv_w, 4, a_log, dt_bias, norm_w, 1e-6f, convs, recs,
                          out.get());
        };
        const double s = time_replays(*be_, step, 1, key_++);
        add(fmt::format("gdn_decode batch {} ({} state)", n, bf16 ? "bf16" : "fp32"), s,
            gbs(2.0 * double(n) * double(slot) * (bf16 ? 2 : 4), s));
        mem.free_cache(pool);
      }
    }
  }

  std::unique_ptr<Backend> be_;
  // Expert lists live as long as the bench: the backend keys its device expert tables by the list's address,
  // so a freed list whose storage a later one reuses would find the earlier table.
  std::deque<std::vector<SwiGlu>> expert_sets_;
  std::vector<Row> rows_;
  double copy_bw_ = 1, gemm_rate_ = 1;
  uint64_t key_ = 1000;
};

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  try {
    if (!moeserve::cuda_available()) {
      std::printf("no CUDA device visible: nothing to benchmark\n");
      return 0;
    }
    moeserve::OpsBench().run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
