// Speculative decoding's step cost against its acceptance length, on random weights (a preset's shape, MTP
// layer included). Random weights accept almost no drafts, so acceptance is forced: this benchmark alone sets
// EngineOptions::benchmark_forced_acceptance (serve and generate cannot), which accepts the first A drafts of
// every verify step whatever the model says; the output then is not the model's. Each line: drafts per step
// k, forced accepted drafts A, the measured mean acceptance length (A + 1), decode ms per engine step and
// tok/s, against plain decoding at the same batch size; "adaptive" rows run with the model's own (failing)
// drafts and the adaptive pause on, the cost of speculation at acceptance 0. "drafting" is the part of a step
// the MTP layer's draft steps took (the rest is the verify forward and the engine's own work).
// Run: build/bench/speculative_bench [--device cuda] [--preset 35b-a3b] [--batches 1,16] [--steps 1,2,3,4]
//      [--logit-candidates 0]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "common/error.h"
#include "engine/engine.h"
#include "model/init_model.h"

namespace moeserve {
namespace {

struct Options {
  std::string device = "cpu";
  std::string preset = "tiny";
  int layers = 0;  // 0: the preset's
  std::vector<int> batches = {1};
  std::vector<int> steps = {1, 2, 3, 4};
  int context = 256;  // prompt tokens per request
  int tokens = 64;    // generated tokens per request
  // Rows reduced to this many candidates where the logits are (-1: the engine's default, kMaxLogitsTopk on
  // a GPU; 0: whole rows, the verify step as it was before candidates).
  int logit_candidates = -1;
};

using Clock = std::chrono::steady_clock;

struct Measured {
  double step_ms = 0;   // wall time per engine step while decoding
  double draft_ms = 0;  // of which the MTP layer drafting
  double tok_s = 0;     // generated tokens per second while decoding
  double acceptance_length = 0;
};

// B requests of `context` prompt tokens, `tokens` greedy tokens each; decode time runs from the moment every
// request has its first token to the last token.
Measured measure(const ModelWeights& weights, Backend& backend, const Options& o, int batch, int k,
                 int forced, bool adaptive) {
  EngineOptions eo;
  eo.backend = &backend;
  eo.max_running_requests = batch;
  eo.snapshot_slots = 0;
  eo.enable_prefix_cache = false;
  eo.max_model_len = o.context + o.tokens + 16;
  eo.speculative_num_steps = k;
  eo.speculative_adaptive = adaptive;
  eo.benchmark_forced_acceptance = forced;
  eo.logit_candidates = o.logit_candidates;
  auto engine = Engine::create(weights, eo);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(size_t(o.context));
    for (size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = int32_t((1 + i * 7919 + size_t(b) * 104729) % uint64_t(weights.config.vocab_size));
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = o.tokens;
    p.ignore_eos = true;
    streams.push_back(std::make_shared<OutputStream>());
    engine->submit({"b" + std::to_string(b), prompt, p, 0, streams.back()->sink()});
  }
  for (auto& s : streams) check(s->next().has_value(), "no first token");
  const auto t0 = Clock::now();
  const EngineStats before = engine->stats();
  int64_t tokens = 0;
  for (auto& s : streams) {
    GenerateOutput rest = s->collect();
    check(rest.finish_reason == FinishReason::Length, "request ended early: {}", rest.error);
    tokens += int64_t(rest.tokens.size());
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const EngineStats after = engine->stats();
  Measured m;
  const double steps = double(std::max<uint64_t>(after.steps - before.steps, 1));
  m.step_ms = 1e3 * s / steps;
  m.draft_ms = 1e3 * (after.spec_draft_seconds - before.spec_draft_seconds) / steps;
  m.tok_s = double(tokens) / s;
  m.acceptance_length =
      after.spec_drafts ? 1.0 + double(after.spec_accepted_tokens) / double(after.spec_drafts) : 1.0;
  return m;
}

int run(const Options& o) {
  auto backend = make_backend(o.device);
  ModelConfig config = preset_config(o.preset, o.layers);
  config.mtp_num_layers = 1;
  // Random weights where the backend runs (a GPU: no host copy of a 35B model), as serve --load-format dummy.
  ModelWeights weights = make_dummy_weights_on(*backend, config, 1);
  std::printf("%s on %s, %d-token prompts, %d generated tokens per request, logit candidates %s\n",
              config.summary().c_str(), o.device.c_str(), o.context, o.tokens,
              o.logit_candidates < 0 ? "default" : std::to_string(o.logit_candidates).c_str());
  for (int batch : o.batches) {
    const Measured plain = measure(weights, *backend, o, batch, 0, -1, false);
    std::printf("batch %3d plain                    %8.3f ms/step %9.1f tok/s\n", batch, plain.step_ms,
                plain.tok_s);
    for (int k : o.steps) {
      const Measured a = measure(weights, *backend, o, batch, k, -1, true);
      std::printf(
          "batch %3d k=%d adaptive, length %.2f %8.3f ms/step %9.1f tok/s  %5.2fx  drafting %.3f ms\n", batch,
          k, a.acceptance_length, a.step_ms, a.tok_s, a.tok_s / plain.tok_s, a.draft_ms);
      for (int forced = 0; forced <= k; ++forced) {
        const Measured m = measure(weights, *backend, o, batch, k, forced, false);
        std::printf(
            "batch %3d k=%d forced %d, length %.2f %8.3f ms/step %9.1f tok/s  %5.2fx  drafting %.3f ms\n",
            batch, k, forced, m.acceptance_length, m.step_ms, m.tok_s, m.tok_s / plain.tok_s, m.draft_ms);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  CLI::App app{"speculative decoding: step cost against forced acceptance length (benchmark only)"};
  moeserve::Options o;
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--preset", o.preset, "model shape (tiny, 35b-a3b, ...)")->capture_default_str();
  app.add_option("--layers", o.layers, "keep the first N layers (0: all)")->capture_default_str();
  app.add_option("--batches", o.batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--steps", o.steps, "drafts per verify step")->delimiter(',')->capture_default_str();
  app.add_option("--context", o.context, "prompt tokens per request")->capture_default_str();
  app.add_option("--tokens", o.tokens, "generated tokens per request")->capture_default_str();
  app.add_option("--logit-candidates", o.logit_candidates,
                 "rows reduced to N candidates on the device (-1: engine default; 0: whole rows)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return moeserve::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
