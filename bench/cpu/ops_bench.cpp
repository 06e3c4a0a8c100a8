// CPU backend op families at Qwen3.5-35B-A3B shapes. Counters: bytes/s of weights streamed (what bounds
// decode) and FLOP/s, per second of wall time (the pool's workers do not show in the main thread's CPU time).
// Run: build/bench/bench_cpu_ops [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/delta_rule.h"
#include "common/dtype.h"

namespace moeserve {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct OwnedMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  Matrix view;
  OwnedMatrix(int64_t rows, int64_t cols, DType dtype) {
    auto v = random_floats(size_t(rows * cols), 1);
    bytes.resize(v.size() * dtype_size(dtype));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(v[i]);
      else if (dtype == DType::F8_E4M3) bytes[i] = f32_to_fp8_e4m3(v[i] * 100);
      else reinterpret_cast<float*>(bytes.data())[i] = v[i];
    }
    view = Matrix{dtype, rows, cols, bytes.data()};
    if (dtype == DType::F8_E4M3) {
      scales.assign(size_t(((rows + 127) / 128) * ((cols + 127) / 128)), 0.01f);
      view.scale_inv = scales.data();
      view.block_rows = view.block_cols = 128;
    }
  }
};

// y = x Wᵀ with W [2048 x 2048] (an attention-sized projection); Arg(0) = tokens, Arg(1) = dtype.
void BM_Matmul(benchmark::State& state) {
  const int64_t n = state.range(0), M = 2048, K = 2048;
  const DType dtype = state.range(1) == 0 ? DType::BF16 : state.range(1) == 1 ? DType::F8_E4M3 : DType::F32;
  OwnedMatrix w(M, K, dtype);
  auto x = random_floats(size_t(n * K), 2);
  std::vector<float> y(size_t(n * M));
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->matmul(x.data(), n, w.view, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(dtype_name(dtype)));
  state.counters["weight_GB/s"] = benchmark::Counter(double(w.bytes.size()) * double(state.iterations()) / 1e9,
                                                     benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * M * K * double(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Matmul)->ArgsProduct({{1, 16, 128}, {0, 1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();

// One MoE layer of 35B-A3B (256 experts of 512 x 2048, top-8) on Arg(0) tokens.
void BM_MoeExperts(benchmark::State& state) {
  const int64_t n = state.range(0), hidden = 2048, inter = 512;
  const int E = 256, top_k = 8;
  std::vector<OwnedMatrix> mats;
  mats.reserve(3 * E);
  std::vector<SwiGlu> experts;
  for (int e = 0; e < E; ++e) {
    mats.emplace_back(inter, hidden, DType::BF16);
    mats.emplace_back(inter, hidden, DType::BF16);
    mats.emplace_back(hidden, inter, DType::BF16);
  }
  for (int e = 0; e < E; ++e) experts.push_back({mats[3 * e].view, mats[3 * e + 1].view, mats[3 * e + 2].view});
  auto x = random_floats(size_t(n * hidden), 3), logits = random_floats(size_t(n * E), 4);
  std::vector<float> out(size_t(n * hidden));
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->moe_experts(experts, logits.data(), top_k, true, x.data(), n, hidden, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(double(n) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MoeExperts)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

// Decode attention of one token over Arg(0) cached positions: 16 heads, 2 KV heads, head_dim 256.
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t context = state.range(0);
  const int heads = 16, kv_heads = 2, hd = 256, page_size = 16;
  KvCache kv({1, kv_heads, hd, page_size, context / page_size + 1});
  std::vector<int32_t> pages(size_t(context / page_size + 1));
  std::iota(pages.begin(), pages.end(), 0);
  auto q = random_floats(size_t(heads * hd), 5), k = random_floats(size_t(kv_heads * hd), 6);
  std::vector<float> out(size_t(heads * hd));
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->paged_attention(q.data(), k.data(), k.data(), 1, heads, kv_heads, hd, context - 1, pages, kv, 0, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["KV_GB/s"] = benchmark::Counter(2.0 * context * kv_heads * hd * 4 * double(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PagedAttentionDecode)->Arg(1024)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime();

// The gated delta rule of one 128 x 128 head over Arg(0) tokens; Arg(1) = 0 recurrent, 1 chunked.
void BM_DeltaRule(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int dk = 128, dv = 128;
  auto q = random_floats(size_t(T * dk), 7), k = random_floats(size_t(T * dk), 8), v = random_floats(size_t(T * dv), 9);
  std::vector<float> g(size_t(T), -0.1f), beta(size_t(T), 0.5f), out(size_t(T * dv)), S(size_t(dk * dv));
  cpu::DeltaRuleHead head{q.data(), k.data(), dk, v.data(), dv, g.data(), beta.data(), 1, out.data(), dv};
  for (auto _ : state) {
    if (state.range(1)) cpu::delta_rule_chunked(head, T, dk, dv, S.data());
    else cpu::delta_rule_recurrent(head, T, dk, dv, S.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(state.range(1) ? "chunked" : "recurrent");
  state.counters["tokens/s"] = benchmark::Counter(double(T) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DeltaRule)->ArgsProduct({{1, 256}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// RMSNorm over Arg(0) rows of 2048.
void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = 2048;
  auto x = random_floats(size_t(rows * dim), 10), w = random_floats(size_t(dim), 11);
  std::vector<float> out(x.size());
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->rms_norm(x.data(), rows, dim, dim, w.data(), 1e-6f, true, out.data(), dim);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(8.0 * rows * dim * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RmsNorm)->Arg(1)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Partial NeoX RoPE of the attention queries: Arg(0) tokens x 16 heads x 256, the first 64 dims rotated.
void BM_Rope(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int heads = 16, hd = 256, rotary = 64;
  auto x = random_floats(size_t(tokens * heads * hd), 12);
  std::vector<float> inv_freq(size_t(rotary / 2));
  for (int i = 0; i < rotary / 2; ++i) inv_freq[size_t(i)] = std::pow(1e7f, -2.0f * float(i) / float(rotary));
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->rope(x.data(), tokens, heads, hd, rotary, 1000, inv_freq.data());
    benchmark::DoNotOptimize(x.data());
  }
  const double rotated = double(tokens * heads * rotary) * double(state.iterations());
  state.counters["elements/s"] = benchmark::Counter(rotated, benchmark::Counter::kIsRate);
  state.counters["GB/s"] =
      benchmark::Counter(8.0 * rotated / 1e9, benchmark::Counter::kIsRate);  // read + write
}
BENCHMARK(BM_Rope)->Arg(1)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Depthwise causal conv (kernel 4) + SiLU over the 8192 GDN q,k,v channels for Arg(0) tokens.
void BM_CausalConv(benchmark::State& state) {
  const int64_t T = state.range(0), channels = 8192;
  const int kernel = 4;
  auto x = random_floats(size_t(T * channels), 13), w = random_floats(size_t(channels * kernel), 14);
  std::vector<float> conv_state(size_t(channels * (kernel - 1))), out(x.size());
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->causal_conv1d_silu(x.data(), T, channels, w.data(), kernel, conv_state.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double elements = double(T * channels) * double(state.iterations());
  state.counters["elements/s"] = benchmark::Counter(elements, benchmark::Counter::kIsRate);
  state.counters["GB/s"] =
      benchmark::Counter(8.0 * elements / 1e9, benchmark::Counter::kIsRate);  // x in, out
}
BENCHMARK(BM_CausalConv)->Arg(1)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();

// GDN gates (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)) of 32 value heads for Arg(0) tokens.
void BM_GdnGates(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int v_heads = 32;
  auto b = random_floats(size_t(T * v_heads), 15), a = random_floats(size_t(T * v_heads), 16);
  auto a_log = random_floats(size_t(v_heads), 17), dt_bias = random_floats(size_t(v_heads), 18);
  std::vector<float> beta(b.size()), g(b.size());
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->gdn_gates(b.data(), a.data(), a_log.data(), dt_bias.data(), T, v_heads, beta.data(), g.data());
    benchmark::DoNotOptimize(g.data());
  }
  state.counters["elements/s"] =
      benchmark::Counter(double(T * v_heads) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GdnGates)->Arg(1)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The GDN output norm: RMSNorm of each 128-wide value head, times silu(z), for Arg(0) tokens x 32 heads.
void BM_GatedRmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0) * 32, dim = 128;
  auto o = random_floats(size_t(rows * dim), 19), z = random_floats(size_t(rows * dim), 20);
  auto w = random_floats(size_t(dim), 21);
  std::vector<float> out(o.size());
  auto be = make_cpu_backend();
  for (auto _ : state) {
    be->gated_rms_norm(o.data(), z.data(), rows, dim, w.data(), 1e-6f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(12.0 * double(rows * dim) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);  // o and z in, out
}
BENCHMARK(BM_GatedRmsNorm)->Arg(1)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
