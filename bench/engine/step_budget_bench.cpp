// The per-step token budget (EngineOptions::max_num_batched_tokens) against step time: for each budget B and
// each count D of decoding requests, one long prompt prefills while the D requests decode, so every step
// carries D decode tokens and a prefill chunk of B - D (the scheduler's rule). Each line gives those mixed
// steps' time (the decoders' inter-token latency while a prompt prefills), their tokens per step and tokens
// per second, the prompt's prefill rate, and the D decoders' step time alone. Throughput grows with B until
// the step stops being dominated by reading the weights (the knee), then flattens while the step time, and
// with it every running request's inter-token gap, keeps growing: the default budget is the smallest B
// whose tokens per second is within 10% of the best (docs/engine.md, "Scheduler"); the last lines name it.
// Random weights (a preset's shape), greedy, no prefix cache.
// Run: build/bench/step_budget_bench [--device cuda] [--preset 35b-a3b]
//        [--budgets 512,1024,2048,4096,8192,16384] [--decoders 0,16,64] [--prompt 16384] [--cache-gb N]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>

#include "backend/backend.h"
#include "common/error.h"
#include "engine/engine.h"
#include "model/init_model.h"
#include "table_bench.h"

namespace moeserve {
namespace {

struct Options {
  std::string device = "cpu";
  std::string preset = "tiny";
  int layers = 0;  // 0: the preset's
  std::vector<int> budgets = {256, 512, 1024, 2048, 4096, 8192};
  std::vector<int> decoders = {0, 16};
  int prompt = 8192;          // tokens of the prompt prefilled during the measurement
  int context = 512;          // prompt tokens of each decoding request
  double mem_fraction = 0.8;  // of the memory free after the weights, for the caches
  double cache_gb = 0;        // > 0: this budget instead (on the CPU: the fraction would be of host memory)
};

using Clock = std::chrono::steady_clock;

struct Measured {
  double mixed_ms = 0;  // per step while the prompt prefills
  double tokens_per_step = 0;
  double tok_s = 0;          // all tokens of those steps
  double prefill_tok_s = 0;  // the prompt's tokens alone
  double decode_ms = 0;      // per step of the decoders alone (0 without decoders)
};

std::vector<int32_t> prompt_tokens(const ModelWeights& w, int n, uint64_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = int32_t((1 + i * 7919 + salt * 104729) % uint64_t(w.config.vocab_size));
  return p;
}

// Runs until stream has delivered `tokens` more tokens; returns false when it finished first.
bool wait_tokens(OutputStream& s, int tokens) {
  for (int got = 0; got < tokens;) {
    auto out = s.next();
    check(out.has_value(), "stream ended");
    check(out->finish_reason != FinishReason::Error, "request failed: {}", out->error);
    got += int(out->tokens.size());
    if (out->finished) return false;
  }
  return true;
}

Measured measure(const ModelWeights& weights, Backend& backend, const Options& o, int budget, int decoders) {
  EngineOptions eo;
  eo.backend = &backend;
  eo.max_running_requests = decoders + 1;
  eo.snapshot_slots = 0;
  eo.enable_prefix_cache = false;
  eo.max_model_len = std::max(o.prompt, o.context + 4096) + 16;
  eo.mem_fraction = o.mem_fraction;
  eo.cache_memory_bytes = int64_t(o.cache_gb * double(1 << 30));
  eo.max_num_batched_tokens = budget;
  auto engine = Engine::create(weights, eo);
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int d = 0; d < decoders; ++d) {
    streams.push_back(std::make_shared<OutputStream>());
    p.max_tokens = 4096;
    engine->submit({"d" + std::to_string(d), prompt_tokens(weights, o.context, uint64_t(d)), p, 0,
                    streams.back()->sink()});
  }
  Measured m;
  if (decoders > 0) {
    for (auto& s : streams) check(wait_tokens(*s, 1), "a decoder finished early");
    check(wait_tokens(*streams[0], 8), "a decoder finished early");  // warm up (graph recording)
    const auto t0 = Clock::now();
    const uint64_t s0 = engine->stats().steps;
    check(wait_tokens(*streams[0], 32), "a decoder finished early");
    m.decode_ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count() /
                  double(std::max<uint64_t>(engine->stats().steps - s0, 1));
  }
  auto prompt = std::make_shared<OutputStream>();
  p.max_tokens = 1;
  const auto t0 = Clock::now();
  const EngineStats before = engine->stats();
  engine->submit({"prompt", prompt_tokens(weights, o.prompt, 999), p, 0, prompt->sink()});
  GenerateOutput out = prompt->collect();
  check(out.finish_reason == FinishReason::Length, "the prompt failed: {}", out.error);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const EngineStats after = engine->stats();
  const double steps = double(std::max<uint64_t>(after.steps - before.steps, 1));
  const double tokens = double(after.step_tokens - before.step_tokens);
  m.mixed_ms = 1e3 * s / steps;
  m.tokens_per_step = tokens / steps;
  m.tok_s = tokens / s;
  m.prefill_tok_s = o.prompt / s;
  for (int d = 0; d < decoders; ++d) engine->cancel("d" + std::to_string(d));
  return m;
}

int run(const Options& o) {
  auto backend = make_backend(o.device);
  ModelConfig config = preset_config(o.preset, o.layers);
  // Random weights where the backend runs (a GPU: no host copy of a 35B model), as serve --load-format dummy.
  ModelWeights weights = make_dummy_weights_on(*backend, config, 1);
  std::printf("%s on %s; a %d-token prompt prefills while D requests of %d-token prompts decode\n",
              config.summary().c_str(), o.device.c_str(), o.prompt, o.context);
  std::printf("%7s %4s %12s %12s %10s %14s %15s\n", "budget", "D", "mixed ms/step", "tokens/step", "tok/s",
              "prefill tok/s", "decode ms/step");
  std::map<int, std::vector<std::pair<int, double>>> by_decoders;  // D -> (budget, tok/s)
  for (int d : o.decoders) {
    for (int b : o.budgets) {
      if (b <= d) continue;  // no prefill room but the minimum share: not this benchmark's question
      const Measured m = measure(weights, *backend, o, b, d);
      std::printf("%7d %4d %12.2f %12.0f %10.0f %14.0f %15.2f\n", b, d, m.mixed_ms, m.tokens_per_step,
                  m.tok_s, m.prefill_tok_s, m.decode_ms);
      std::fflush(stdout);
      by_decoders[d].emplace_back(b, m.tok_s);
    }
  }
  for (const auto& [d, rows] : by_decoders) {
    double best = 0;
    for (const auto& [b, t] : rows) best = std::max(best, t);
    for (const auto& [b, t] : rows) {
      if (t >= 0.9 * best) {
        std::printf("D=%d: the knee (smallest budget within 10%% of the best %.0f tok/s) is %d tokens\n", d,
                    best, b);
        break;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  CLI::App app{"step time and throughput against the per-step token budget"};
  moeserve::Options o;
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--preset", o.preset, "model shape (tiny, 35b-a3b, ...)")->capture_default_str();
  app.add_option("--layers", o.layers, "keep the first N layers (0: all)")->capture_default_str();
  app.add_option("--budgets", o.budgets, "tokens per step to try")->delimiter(',')->capture_default_str();
  app.add_option("--decoders", o.decoders, "decoding requests beside the prompt")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "tokens of the prompt prefilled while they decode")
      ->capture_default_str();
  app.add_option("--context", o.context, "prompt tokens of each decoding request")->capture_default_str();
  app.add_option("--mem-fraction", o.mem_fraction, "share of the free memory for the caches")
      ->capture_default_str();
  app.add_option("--cache-gb", o.cache_gb, "cache budget in GiB instead (0: --mem-fraction)");
  return moeserve::bench::run_table_bench(app, argc, argv, [&] { return moeserve::run(o); });
}
