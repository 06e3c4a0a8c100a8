// The CPU backend's matmul (Highway kernels, bf16 or FP8 weights widened to float32) against oneDNN's matmul
// primitive on the same bf16 weights, at the projection shapes of Qwen3.5-35B-A3B. Answers issue 2's "Highway
// or oneDNN, measure which"; the figures and the decision are in docs/forward.md ("Highway or oneDNN").
//
// Built only when oneDNN is installed (apt-get install libdnnl-dev). The thread count is fixed per process
// (the global ThreadPool is sized once), so run it once per count:
//   build/bench/bench_cpu_onednn_compare --threads=1 --benchmark_repetitions=5
//   build/bench/bench_cpu_onednn_compare --threads=2 --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/simd.h"
#include "common/dtype.h"
#include "common/thread_pool.h"

namespace moeserve {
namespace {

// y[n x M] = x[n x K] · Wᵀ with W [M x K], as the model stores its projections.
struct Shape {
  const char* name;
  int64_t M, K;
};
constexpr Shape kShapes[] = {
    {"expert_gate_up 512x2048", 512, 2048},  // each of 256 experts (top-8 per token), also the shared expert
    {"expert_down 2048x512", 2048, 512},
    {"in_proj_qkv/q_proj 8192x2048", 8192, 2048},  // GDN q,k,v (8192 conv channels); attention q + gate
    {"out_proj/o_proj 2048x4096", 2048, 4096},     // GDN and attention output projections
};
constexpr int kShapeCount = int(std::size(kShapes));

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Decode reads every weight once per token from memory, not from cache: each benchmark cycles through enough
// copies of its weights (at least 256 MB of bf16, 8x this machine's 32 MB L3) that none is still cached when
// it comes round again. The copies hold the same values at different addresses.
constexpr size_t kColdBytes = size_t(256) << 20;

// Weights of one shape in bf16 and in block-scaled FP8, from the same random floats, `copies` times each.
struct Weights {
  size_t copies, elems;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;
  std::vector<float> fp8_scales;
  std::vector<Matrix> bf16_views, fp8_views;
  explicit Weights(const Shape& s) : elems(size_t(s.M * s.K)) {
    copies = std::max<size_t>(2, (kColdBytes + 2 * elems - 1) / (2 * elems));
    auto v = random_floats(elems, 1);
    bf16.resize(copies * elems);
    fp8.resize(copies * elems);
    for (size_t i = 0; i < elems; ++i) {
      bf16[i] = f32_to_bf16(v[i]);
      fp8[i] = f32_to_fp8_e4m3(v[i] * 100);
    }
    for (size_t c = 1; c < copies; ++c) {
      std::memcpy(bf16.data() + c * elems, bf16.data(), elems * 2);
      std::memcpy(fp8.data() + c * elems, fp8.data(), elems);
    }
    fp8_scales.assign(size_t(((s.M + 127) / 128) * ((s.K + 127) / 128)), 0.01f);
    for (size_t c = 0; c < copies; ++c) {
      bf16_views.push_back(Matrix{DType::BF16, s.M, s.K, bf16.data() + c * elems});
      Matrix f{DType::F8_E4M3, s.M, s.K, fp8.data() + c * elems};
      f.scale_inv = fp8_scales.data();
      f.block_rows = f.block_cols = 128;
      fp8_views.push_back(f);
    }
  }
};

void set_counters(benchmark::State& state, const Shape& s, int64_t n, size_t weight_bytes) {
  const double iters = double(state.iterations());
  state.counters["weight_GB/s"] =
      benchmark::Counter(double(weight_bytes) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(s.M) * double(s.K) * iters / 1e9,
                                                 benchmark::Counter::kIsRate);
}

// Arg(0) = shape, Arg(1) = tokens n, Arg(2) = 0 bf16 / 1 FP8 weights.
void BM_Highway(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int64_t n = state.range(1);
  const bool fp8 = state.range(2) == 1;
  Weights w(s);
  auto x = random_floats(size_t(n * s.K), 2);
  std::vector<float> y(size_t(n * s.M));
  auto be = make_cpu_backend();
  size_t copy = 0;
  for (auto _ : state) {
    be->matmul(x.data(), n, fp8 ? w.fp8_views[copy] : w.bf16_views[copy], y.data());
    benchmark::DoNotOptimize(y.data());
    copy = (copy + 1) % w.copies;
  }
  state.SetLabel(std::string(s.name) + (fp8 ? " fp8" : " bf16"));
  set_counters(state, s, n, fp8 ? w.elems : w.elems * 2);
}

// Arg(0) = shape, Arg(1) = tokens n, Arg(2) = layout: 0 "plain" reads our row-major [M x K] bf16 buffer in
// place (oneDNN weights {K, M} with tag ba); 1 "packed" lets oneDNN choose its blocked layout (tag any),
// reordered once outside the loop, as a model loader would. oneDNN 2.6 has no f32 x bf16 matmul, so the
// activations are rounded to bf16 inside the timed loop (our API hands f32 activations); dst is f32.
void BM_OneDnn(benchmark::State& state) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const Shape& s = kShapes[state.range(0)];
  const int64_t n = state.range(1);
  const bool packed = state.range(2) == 1;
  Weights w(s);
  auto x = random_floats(size_t(n * s.K), 2);
  std::vector<float> y(size_t(n * s.M));

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl::memory::desc x_f32_md({n, s.K}, dt::f32, tag::ab), x_bf16_md({n, s.K}, dt::bf16, tag::ab);
  const dnnl::memory::desc w_plain_md({s.K, s.M}, dt::bf16, tag::ba),
      w_any_md({s.K, s.M}, dt::bf16, tag::any);
  const dnnl::memory::desc y_md({n, s.M}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(x_bf16_md, packed ? w_any_md : w_plain_md, y_md),
                                      eng);
  } catch (const dnnl::error& e) {
    state.SkipWithError((std::string("oneDNN refused the matmul: ") + e.what()).c_str());
    return;
  }
  dnnl::memory x_f32(x_f32_md, eng, x.data()), x_bf16(x_bf16_md, eng), y_mem(y_md, eng, y.data());
  std::vector<dnnl::memory> w_used;
  for (size_t c = 0; c < w.copies; ++c) {
    dnnl::memory plain(w_plain_md, eng, w.bf16.data() + c * w.elems);
    if (!packed || pd.weights_desc() == w_plain_md) {
      w_used.push_back(plain);
      continue;
    }
    w_used.emplace_back(pd.weights_desc(), eng);
    dnnl::reorder(plain, w_used.back()).execute(strm, plain, w_used.back());
  }
  size_t copy = 0;
  dnnl::reorder to_bf16(x_f32, x_bf16);
  dnnl::matmul mm(pd);
  auto run = [&] {
    to_bf16.execute(strm, x_f32, x_bf16);
    mm.execute(strm, {{DNNL_ARG_SRC, x_bf16}, {DNNL_ARG_WEIGHTS, w_used[copy]}, {DNNL_ARG_DST, y_mem}});
    strm.wait();
  };

  // Same weights, same inputs: the result must agree with the backend's (bf16-rounded activations aside),
  // or the figures compare different work.
  run();
  std::vector<float> ref(y.size());
  make_cpu_backend()->matmul(x.data(), n, w.bf16_views[0], ref.data());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_err = std::max(max_err, double(std::fabs(y[i] - ref[i])));
    max_ref = std::max(max_ref, double(std::fabs(ref[i])));
  }
  if (max_err > 0.02 * max_ref) {
    state.SkipWithError("oneDNN's result differs from the backend's");
    return;
  }

  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
    copy = (copy + 1) % w.copies;
  }
  state.SetLabel(std::string(s.name) + (packed ? " packed " : " plain ") + pd.impl_info_str());
  set_counters(state, s, n, w.elems * 2);
  state.counters["rel_err"] = max_err / max_ref;
}

// What the weight-streaming figures compare against: reading an Arg(0) MB buffer (1024: 32x L3) with the
// backend's SIMD dot product on every thread of the pool, the most bytes per second a matmul that reads each
// weight once can see.
void BM_MemoryRead(benchmark::State& state) {
  std::vector<float> buf(size_t(state.range(0)) << 18, 1.0f);
  auto& pool = ThreadPool::global();
  std::vector<float> partial(pool.size());
  for (auto _ : state) {
    pool.parallel_for(pool.size(), [&](size_t p0, size_t p1) {
      for (size_t p = p0; p < p1; ++p) {
        const size_t per = buf.size() / pool.size();
        partial[p] = cpu::dot(buf.data() + p * per, buf.data() + p * per, per);
      }
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.counters["GB/s"] = benchmark::Counter(double(buf.size() * 4) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MemoryRead)->Arg(16)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void shapes(benchmark::internal::Benchmark* b, std::initializer_list<int64_t> variants) {
  for (int shape = 0; shape < kShapeCount; ++shape)
    for (int64_t n : {1, 16, 128})
      for (int64_t v : variants) b->Args({shape, n, v});
  // Wall time: the pool's and OpenMP's worker threads do not show in the main thread's CPU time.
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Highway)->Apply([](auto* b) { shapes(b, {0, 1}); });
BENCHMARK(BM_OneDnn)->Apply([](auto* b) { shapes(b, {0, 1}); });

}  // namespace
}  // namespace moeserve

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    default:
      return "other";
  }
}

// --threads=N (default: every core) sizes both the backend's pool and oneDNN's OpenMP team; the rest goes to
// Google Benchmark.
int main(int argc, char** argv) {
  int threads = 0;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      threads = std::atoi(argv[i] + 10);
    else
      args.push_back(argv[i]);
  }
  if (threads <= 0) threads = omp_get_num_procs();
  moeserve::ThreadPool::set_global_threads(size_t(threads));
  omp_set_num_threads(threads);
  int count = int(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;

  std::string hwy_targets;
  for (int64_t t : hwy::SupportedAndGeneratedTargets())
    hwy_targets += std::string(hwy_targets.empty() ? "" : " ") + hwy::TargetName(t);
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::AddCustomContext("highway targets (first is dispatched)", hwy_targets);
  benchmark::AddCustomContext("onednn", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                            std::to_string(v->patch) + ", isa " +
                                            isa_name(dnnl::get_effective_cpu_isa()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
