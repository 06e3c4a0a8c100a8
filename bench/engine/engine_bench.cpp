// The engine end to end on the CPU backend: decode throughput by batch size, mixed prefill + decode batches,
// and what the prefix cache saves on a multi-turn workload. Model: tests/fixtures/models/small-moe-realdims
// (run from the source root), or MOESERVE_BENCH_MODEL=<checkpoint dir>.
// Run: build/bench/bench_engine [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>

#include "engine/engine.h"
#include "model/checkpoint.h"

namespace moeserve {
namespace {

const ModelWeights& weights() {
  static const ModelWeights w = [] {
    const char* dir = std::getenv("MOESERVE_BENCH_MODEL");
    return load_checkpoint(dir ? dir : "tests/fixtures/models/small-moe-realdims");
  }();
  return w;
}

EngineOptions options(bool prefix_cache = true) {
  EngineOptions o;
  o.cache_memory_bytes = 256 << 20;
  o.max_running_requests = 32;
  o.chunked_prefill_size = 512;
  o.max_num_batched_tokens = 2048;
  o.max_model_len = 4096;
  o.enable_prefix_cache = prefix_cache;
  return o;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = std::uniform_int_distribution<int>(0, int(weights().config.vocab_size) - 1)(rng);
  return t;
}

// Runs the requests to completion; returns their outputs in order.
std::vector<GenerateOutput> run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                int max_tokens, const std::string& tag) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    auto s = std::make_shared<OutputStream>();
    engine.submit({tag + std::to_string(i), prompts[i], p, 0, s->sink()});
    streams.push_back(s);
  }
  std::vector<GenerateOutput> out;
  for (auto& s : streams) out.push_back(s->collect());
  return out;
}

void set_engine_counters(benchmark::State& state, const EngineStats& before, const EngineStats& after) {
  state.counters["gen_tok/s"] = benchmark::Counter(double(after.generation_tokens - before.generation_tokens),
                                                   benchmark::Counter::kIsRate);
  state.counters["prefill_tok/s"] =
      benchmark::Counter(double(after.prefill_tokens - before.prefill_tokens), benchmark::Counter::kIsRate);
  state.counters["steps/s"] =
      benchmark::Counter(double(after.steps - before.steps), benchmark::Counter::kIsRate);
}

// `batch` requests with 16-token prompts decoding 64 tokens each: decode-dominated.
void BM_Decode(benchmark::State& state) {
  const int batch = int(state.range(0));
  auto engine = Engine::create(weights(), options(false));
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < batch; ++i) prompts.push_back(random_tokens(rng, 16));
  auto before = engine->stats();
  int round = 0;
  for (auto _ : state) run(*engine, prompts, 64, "d" + std::to_string(round++) + "-");
  set_engine_counters(state, before, engine->stats());
}
BENCHMARK(BM_Decode)->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

// 32 requests with prompts of 32..512 tokens and 32 new tokens: prefill chunks ride along with decodes.
void BM_MixedBatch(benchmark::State& state) {
  auto engine = Engine::create(weights(), options(false));
  std::mt19937 rng(2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 32; ++i)
    prompts.push_back(random_tokens(rng, std::uniform_int_distribution<int>(32, 512)(rng)));
  auto before = engine->stats();
  int round = 0;
  for (auto _ : state) run(*engine, prompts, 32, "m" + std::to_string(round++) + "-");
  set_engine_counters(state, before, engine->stats());
}
BENCHMARK(BM_MixedBatch)->Unit(benchmark::kMillisecond)->UseRealTime();

// 4 conversations of 10 turns, run side by side: each turn appends 64 new prompt tokens to the previous
// turn's prompt and answer, and generates 32. With the prefix cache each turn should compute only its new
// tokens.
void BM_MultiTurn(benchmark::State& state) {
  const bool cache = state.range(0) != 0;
  auto engine = Engine::create(weights(), options(cache));
  auto before = engine->stats();
  int round = 0;
  for (auto _ : state) {
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> conversations(4);
    for (int turn = 0; turn < 10; ++turn) {
      for (auto& c : conversations) {
        auto more = random_tokens(rng, 64);
        c.insert(c.end(), more.begin(), more.end());
      }
      auto outs = run(*engine, conversations, 32, "t" + std::to_string(round++) + "-");
      for (size_t i = 0; i < conversations.size(); ++i)
        conversations[i].insert(conversations[i].end(), outs[i].tokens.begin(), outs[i].tokens.end());
    }
    engine->flush_cache();
  }
  auto after = engine->stats();
  set_engine_counters(state, before, after);
  double queries = double(after.prefix_cache_queries - before.prefix_cache_queries);
  state.counters["hit_rate"] =
      queries > 0 ? double(after.prefix_cache_hits - before.prefix_cache_hits) / queries : 0;
  state.counters["prefill_tokens"] =
      double(after.prefill_tokens - before.prefill_tokens) / double(state.iterations());
}
BENCHMARK(BM_MultiTurn)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
