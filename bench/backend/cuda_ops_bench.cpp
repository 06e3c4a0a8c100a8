// Micro-benchmarks of the CUDA backend's ops at the Qwen3.5-35B-A3B shapes, against the H200's measured
// ceilings (a device-to-device copy for bandwidth, a large bf16 GEMM for tensor-core rate; both measured here
// first). Each figure is the median over replays of a CUDA graph holding many calls, with inputs rotated so
// that repeated calls do not run out of L2. Prints one table.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"
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

  void run() {
    std::printf("%s\n", cuda_tools::device_summary(*be_).c_str());
    ceilings();
    gemv();
    moe();
    attention();
    gdn();
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
        for (int64_t n : {1, 8}) {
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

  void moe() {
    const int E = 256, k = 8;
    const int64_t H = 2048, I = 512;
    for (DType dt : {DType::BF16, DType::F8_E4M3}) {
      std::vector<SwiGlu> experts;
      for (int e = 0; e < E; ++e)
        experts.push_back(
            {matrix(dt, I, H, 100 + 3 * e), matrix(dt, I, H, 101 + 3 * e), matrix(dt, H, I, 102 + 3 * e)});
      const double expert_bytes = 3.0 * H * I * dtype_size(dt);
      for (int64_t n : {1, 4, 16, 64, 256, 2048, 8192}) {
        if (dt == DType::F8_E4M3 && n > 64 && n < 2048) continue;
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
        const std::string path = n * k >= 1024 ? "mma" : "simt";
        add(fmt::format("moe E=256 top8 {} n={} ({})", dtype_name(dt), n, path), s,
            n <= 256 ? gbs(touched * expert_bytes, s) + fmt::format(" {:.0f} experts", touched)
                     : tflops(flops, s));
      }
    }
  }

  void attention() {
    const int heads = 16, kvh = 2, hd = 256, page_size = 16;
    for (int64_t ctx : {4096, 32768}) {
      const int64_t pages_n = ctx / page_size + 1;
      KvCache kv({1, kvh, hd, page_size, pages_n, be_->cache_memory()});
      const size_t kv_floats = size_t(pages_n * page_size * kvh * hd);
      cuda_tools::fill_random(*be_, kv.keys(0, 0), DType::F32, int64_t(kv_floats), 40, 1.0f);
      cuda_tools::fill_random(*be_, kv.values(0, 0), DType::F32, int64_t(kv_floats), 41, 1.0f);
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
      add(fmt::format("attention decode ctx={} (fp32 KV, split-K)", ctx), s,
          gbs(2.0 * ctx * kvh * hd * 4, s));
    }
    for (int64_t T : {1024, 8192}) {
      const int64_t pages_n = T / page_size + 1;
      KvCache kv({1, kvh, hd, page_size, pages_n, be_->cache_memory()});
      std::vector<int32_t> pages(static_cast<size_t>(pages_n));
      std::iota(pages.begin(), pages.end(), 0);
      float* q = floats(size_t(T * heads * hd), 44);
      float* kn = floats(size_t(T * kvh * hd), 45);
      auto out = be_->allocate(size_t(T * heads * hd));
      double s = bench::time_direct(
          *be_, [&] { be_->paged_attention(q, kn, kn, T, heads, kvh, hd, 0, pages, kv, 0, out.get()); });
      add(fmt::format("attention prefill T={} (fp32 SIMT)", T), s,
          tflops(4.0 * heads * hd * T * (T + 1) / 2, s));
    }
  }

  void gdn() {
    const DeltaRuleShape sh{16, 32, 128, 128};
    const int64_t C = 8192, key_dim = 2048;
    float* state = be_->cache_memory()->allocate_cache(size_t(32 * 128 * 128));
    float* conv_state = be_->cache_memory()->allocate_cache(size_t(C * 3));
    std::vector<float> w(size_t(C * 4), 0.1f);
    be_->prepare(w.data(), w.size());
    for (int64_t T : {1, 1024, 8192}) {
      float* qkv = floats(size_t(T * C), 50);
      float* g = floats(size_t(T * 32), 51, 0.1f);
      float* beta = floats(size_t(T * 32), 52, 0.5f);
      auto out = be_->allocate(size_t(T * 32 * 128)), conv_out = be_->allocate(size_t(T * C));
      const int reps = T == 1 ? 16 : 1;
      auto delta = [&] {
        for (int r = 0; r < reps; ++r)
          be_->gated_delta_rule(sh, qkv, qkv + key_dim, C, qkv + 2 * key_dim, C, g, beta, T, state,
                                out.get());
      };
      auto conv = [&] {
        for (int r = 0; r < reps; ++r)
          be_->causal_conv1d_silu(qkv, T, C, w.data(), 4, conv_state, conv_out.get());
      };
      if (T == 1) {
        double s = time_replays(*be_, delta, reps, key_++);
        add("gated delta rule decode (32 heads, fp32 state)", s, gbs(2.0 * 32 * 128 * 128 * 4, s));
        s = time_replays(*be_, conv, reps, key_++);
        add("causal conv1d decode (8192 channels)", s, gbs(2.0 * T * C * 4, s));
      } else {
        double s = bench::time_direct(*be_, delta);
        add(fmt::format("gated delta rule prefill T={} (recurrent)", T), s,
            fmt::format("{:7.0f} tok/s", T / s));
        s = bench::time_direct(*be_, conv);
        add(fmt::format("causal conv1d prefill T={}", T), s, gbs(2.0 * T * C * 4, s));
      }
    }
  }

  std::unique_ptr<Backend> be_;
  std::vector<Row> rows_;
  double copy_bw_ = 1, gemm_rate_ = 1;
  uint64_t key_ = 1000;
};

}  // namespace
}  // namespace moeserve

int main() {
  try {
    if (!moeserve::cuda_available()) {
      std::printf("no CUDA device visible: nothing to benchmark\n");
      return 0;
    }
    moeserve::OpsBench().run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
