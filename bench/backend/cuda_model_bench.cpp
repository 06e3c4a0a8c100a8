// The Qwen3.5 forward pass on the CUDA backend with random ("dummy") weights made directly in GPU memory:
// prefill tok/s, decode tok/s at several batch sizes (decode steps are CUDA graphs), and the per-op time
// split.
// `--layers` takes a slice of the 40-layer stack (the 3 GDN + 1 attention pattern); per-layer figures then
// extrapolate to 40 layers, which the report does and says.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"
#include "common/error.h"
#include "dummy_model.h"
#include "engine/sampler.h"
#include "model/qwen35.h"
#include "storage/kv_cache.h"
#include "table_bench.h"

namespace moeserve {
namespace {

struct Options {
  std::string preset = "35b-a3b";
  int layers = 40;
  std::vector<int64_t> prompts = {1024, 8192};
  std::vector<int> batches = {1, 16, 64};
  int decode_steps = 64;
  int64_t context = 256;  // prompt length before decode steps
  bool profile = true;
  bool fp8 = false;
  std::string kv_cache_dtype = "auto";      // as serve: bf16 on the GPU
  std::string gdn_state_dtype = "float32";  // as serve: float32 or bfloat16 state slots
  // How decode steps pick their tokens: full-greedy / full-top-p (every logits row to the host, the sampler
  // there), greedy / top-p (rows reduced to candidates on the GPU), none (logits downloaded, nothing
  // sampled).
  std::vector<std::string> sampling = {"full-greedy", "greedy", "top-p"};
  // lm_head scale: random weights give flat rows; ~10 peaks them like a trained model's.
  float logit_scale = 1.0f;
  std::vector<int> profile_batches = {1};  // decode batch sizes of the per-op profile
  int64_t profile_prompt = 1024;           // prompt length of the per-op prefill profile
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(const Options& o) {
  if (!cuda_available()) {
    std::printf("no CUDA device visible: nothing to benchmark\n");
    return 0;
  }
  auto be = make_backend("cuda");
  const DType kv_dtype = resolve_kv_cache_dtype(parse_kv_cache_dtype(o.kv_cache_dtype), be->cache_memory());
  const ModelConfig config = dummy::moe_config(o.preset, o.layers);
  const DType dt = o.fp8 ? DType::F8_E4M3 : DType::BF16;
  uint64_t seed = 1;
  double weight_bytes = 0;
  auto t0 = Clock::now();
  ModelWeights weights =
      dummy::random_weights(config, [&](int64_t rows, int64_t cols, float bound, bool quantizable) {
        // Embeddings, lm_head, router, gates and GDN's b and a stay bf16, as FP8 checkpoints keep them.
        const bool big = rows == config.vocab_size;
        if (big && bound < 1.0f) bound *= o.logit_scale;  // lm_head (the embeddings have bound 1)
        const DType type = quantizable ? dt : DType::BF16;
        const size_t n = size_t(rows * cols);
        void* p = cuda_tools::allocate_device(*be, n * dtype_size(type));
        cuda_tools::fill_random(*be, p, type, int64_t(n), seed++, bound);
        weight_bytes += double(n * dtype_size(type));
        Matrix m{type, rows, cols, p};
        if (type == DType::F8_E4M3) {
          m.block_rows = m.block_cols = 128;
          const int64_t blocks = (rows + 127) / 128 * m.scale_cols();
          auto* s = static_cast<float*>(cuda_tools::allocate_device(*be, size_t(blocks) * 4));
          cuda_tools::fill_random(*be, s, DType::F32, blocks, seed++, 1.0f / 448.0f);
          m.scale_inv = s;
        }
        return m;
      });
  Qwen35Model model(weights, *be);
  auto state_spec = [&](int slots) {
    StateCacheSpec spec = model.state_cache_spec(slots);
    spec.dtype = o.gdn_state_dtype == "bfloat16" ? DType::BF16 : DType::F32;
    return spec;
  };
  cuda_tools::synchronize(*be);
  std::printf("%s\n", config.summary().c_str());
  std::printf("KV cache: %s, GDN state: %s\n", kv_cache_dtype_name(kv_dtype).data(),
              o.gdn_state_dtype.c_str());
  std::printf("%s weights: %.1f GB made on the GPU in %.1f s\n", dtype_name(dt).data(), weight_bytes / 1e9,
              seconds_since(t0));
  std::printf("%s\n", cuda_tools::device_summary(*be).c_str());
  const double per_layer = 40.0 / o.layers;

  auto ids = [&](int64_t n, int64_t s) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 7919 + s * 104729) % config.vocab_size);
    return v;
  };
  const int page_size = 16;

  // Prefill: one sequence, one forward over the whole prompt (logits of the last token).
  for (int64_t T : o.prompts) {
    KvCache kv(model.kv_cache_spec(page_size, T / page_size + 2, kv_dtype));
    StateCache state(state_spec(1));
    std::vector<int32_t> pages(size_t(kv.spec().num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    auto prompt = ids(T, 1);
    SequenceStep step{prompt, 0, pages, 0, false};
    const double s = bench::time_direct(
        *be,
        [&] {
          model.forward({&step, 1}, kv, state);
        },
        2);
    std::printf("prefill %6ld tokens: %8.1f ms  %9.0f tok/s%s\n", long(T), s * 1e3, T / s,
                o.layers == 40 ? ""
                               : fmt::format("  (x{:.1f} layers: ~{:.0f} tok/s at 40 layers, lm_head once)",
                                             per_layer, T / (s * per_layer))
                                     .c_str());
  }

  // Decode: B sequences of `context` tokens each, then steps of one token per sequence, each sampled as the
  // engine does (engine/sampler.h) from its candidates or its full row.
  for (const std::string& mode : o.sampling) {
    check(mode == "full-greedy" || mode == "full-top-p" || mode == "greedy" || mode == "top-p" ||
              mode == "none",
          "--sampling {}: expected full-greedy, full-top-p, greedy, top-p or none", mode);
    const bool candidates = mode == "greedy" || mode == "top-p";
    SamplingParams params;
    params.temperature = mode.find("top-p") != std::string::npos ? 1.0f : 0.0f;
    params.top_p = 0.9f;
    for (int B : o.batches) {
      const int64_t cap = o.context + o.decode_steps + 8;
      const int64_t pages_per_seq = (cap + page_size - 1) / page_size;
      KvCache kv(model.kv_cache_spec(page_size, pages_per_seq * B, kv_dtype));
      StateCache state(state_spec(B));
      std::vector<std::vector<int32_t>> pages(static_cast<size_t>(B));
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B)), next(static_cast<size_t>(B));
      std::vector<SequenceStep> steps(static_cast<size_t>(B));
      std::vector<Sampler> samplers;
      for (int b = 0; b < B; ++b) {
        pages[size_t(b)].resize(size_t(pages_per_seq));
        std::iota(pages[size_t(b)].begin(), pages[size_t(b)].end(), int32_t(b * pages_per_seq));
        prompts[size_t(b)] = ids(o.context, b + 2);
        steps[size_t(b)] = {prompts[size_t(b)], 0, pages[size_t(b)], b, false};
        samplers.emplace_back(params, std::span<const int32_t>{}, uint64_t(b + 1));
        next[size_t(b)] = {int32_t(b)};
      }
      auto tp = Clock::now();
      model.forward(steps, kv, state);
      const double prefill_s = seconds_since(tp);
      int64_t pos = o.context;
      int64_t full_rows = 0;
      double sample_s = 0;
      std::vector<float> row(size_t(config.vocab_size));
      auto decode_step = [&] {
        for (int b = 0; b < B; ++b) {
          steps[size_t(b)] = {next[size_t(b)], pos, pages[size_t(b)], b, false};
          steps[size_t(b)].candidates = candidates ? kMaxLogitsTopk : 0;
        }
        ForwardOutput out = model.forward(steps, kv, state);
        auto ts = Clock::now();
        for (int b = 0; b < B && mode != "none"; ++b) {
          Sampler& sm = samplers[size_t(b)];
          std::optional<int32_t> t;
          if (candidates) t = sm.sample(out.candidates[size_t(b)], {});
          if (!t && candidates) {
            ++full_rows;
            out.fetch_row(size_t(b), row.data());
            t = sm.sample(row, {});
          }
          if (!t) t = sm.sample({out.logits.data() + b * config.vocab_size, size_t(config.vocab_size)}, {});
          next[size_t(b)] = {*t};
        }
        sample_s += seconds_since(ts);
        ++pos;
      };
      for (int i = 0; i < 3; ++i) decode_step();  // measure, record, first replay of the step graph
      cuda_tools::synchronize(*be);
      cuda_tools::graph_timing(*be);  // reset
      full_rows = 0;
      sample_s = 0;
      auto td = Clock::now();
      for (int i = 0; i < o.decode_steps; ++i) decode_step();
      const double s = seconds_since(td) / o.decode_steps;
      std::printf(
          "decode %-11s batch %3d (context %ld): %7.3f ms/step  %8.0f tok/s%s   [host sampling %.2f ms/step, "
          "%.1f%% rows fetched whole; batched prefill %.0f tok/s]\n",
          mode.c_str(), B, long(o.context), s * 1e3, B / s,
          o.layers == 40 ? "" : fmt::format("  (~{:.0f} tok/s at 40 layers)", B / (s * per_layer)).c_str(),
          1e3 * sample_s / o.decode_steps, 100.0 * double(full_rows) / double(B * o.decode_steps),
          double(B * o.context) / prefill_s);
      std::printf("  %s\n", cuda_tools::graph_timing(*be).c_str());
    }
  }

  if (o.profile) {
    // Per-op time of one decode step and one prefill (each op synchronised: costs, not overlapped wall time).
    KvCache kv(model.kv_cache_spec(page_size, o.profile_prompt / page_size + 4, kv_dtype));
    StateCache state(state_spec(1));
    std::vector<int32_t> pages(size_t(kv.spec().num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    auto prompt = ids(o.profile_prompt, 9);
    SequenceStep step{prompt, 0, pages, 0, false};
    cuda_tools::set_profiling(*be, true);
    model.forward({&step, 1}, kv, state);
    std::printf("\nper-op GPU time, prefill of %ld tokens:\n%s", long(o.profile_prompt),
                cuda_tools::profile_report(*be).c_str());
    cuda_tools::reset_profile(*be);
    cuda_tools::set_profiling(*be, false);
    for (int B : o.profile_batches) {
      // B sequences of --context tokens (prefilled unprofiled), then 4 profiled decode steps with candidates.
      const int64_t per_seq = o.context / page_size + 2;
      KvCache dkv(model.kv_cache_spec(page_size, per_seq * B, kv_dtype));
      StateCache dstate(state_spec(B));
      std::vector<std::vector<int32_t>> dpages(static_cast<size_t>(B)), dprompts(static_cast<size_t>(B));
      std::vector<SequenceStep> steps(static_cast<size_t>(B));
      // A different token per sequence: one shared token routes every row to nearly the same experts, which
      // would understate the experts' bytes per step at batch > 1.
      std::vector<int32_t> tok(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        tok[size_t(b)] = ids(1, b + 101)[0];
        dpages[size_t(b)].resize(size_t(per_seq));
        std::iota(dpages[size_t(b)].begin(), dpages[size_t(b)].end(), int32_t(b * per_seq));
        dprompts[size_t(b)] = ids(o.context, b + 11);
        steps[size_t(b)] = {dprompts[size_t(b)], 0, dpages[size_t(b)], b, false};
        model.forward({&steps[size_t(b)], 1}, dkv, dstate);  // one at a time: long contexts fit
      }
      // Step 0 is not profiled: a library's first call of a shape (cuBLAS choosing its kernel, say) holds the
      // GPU idle between the op's events, which would read as GPU time (an FP8 model's first bf16 lm_head at
      // 256 rows: ~50 ms).
      for (int i = 0; i < 5; ++i) {
        if (i == 1) {
          cuda_tools::reset_profile(*be);
          cuda_tools::set_profiling(*be, true);
        }
        for (int b = 0; b < B; ++b) {
          steps[size_t(b)] = {std::span(&tok[size_t(b)], 1), o.context + i, dpages[size_t(b)], b, false};
          steps[size_t(b)].candidates = kMaxLogitsTopk;
        }
        model.forward(steps, dkv, dstate);
      }
      std::printf("\nper-op GPU time, 4 decode steps at batch %d:\n%s", B,
                  cuda_tools::profile_report(*be).c_str());
      cuda_tools::set_profiling(*be, false);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  CLI::App app{"Qwen3.5 forward pass on the CUDA backend with dummy weights"};
  moeserve::Options o;
  app.add_option("--preset", o.preset, "35b-a3b or small")->capture_default_str();
  app.add_option("--layers", o.layers, "layers of the stack to build")->capture_default_str();
  app.add_option("--prompts", o.prompts, "prefill lengths")->capture_default_str();
  app.add_option("--batches", o.batches, "decode batch sizes")->capture_default_str();
  app.add_option("--decode-steps", o.decode_steps, "timed decode steps")->capture_default_str();
  app.add_option("--context", o.context, "prompt tokens per sequence before decoding")->capture_default_str();
  app.add_flag("!--no-profile", o.profile, "skip the per-op profile");
  app.add_flag("--fp8", o.fp8, "FP8 block-scaled weights (embeddings and lm_head bf16)");
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype, "auto (bf16 here), float32, bfloat16 or fp8_e4m3")
      ->capture_default_str();
  app.add_option("--gdn-state-dtype", o.gdn_state_dtype, "GDN state slots: float32 or bfloat16")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  app.add_option("--sampling", o.sampling, "full-greedy, full-top-p, greedy, top-p (T=1, p=0.9) or none")
      ->capture_default_str();
  app.add_option("--profile-prompt", o.profile_prompt, "prompt length of the per-op prefill profile")
      ->capture_default_str();
  app.add_option("--profile-batches", o.profile_batches, "decode batch sizes of the per-op profile")
      ->capture_default_str();
  app.add_option("--logit-scale", o.logit_scale,
                 "scale of the lm_head (10: peaked rows like a trained model's)")
      ->capture_default_str();
  return moeserve::bench::run_table_bench(app, argc, argv, [&] { return moeserve::run(o); });
}
