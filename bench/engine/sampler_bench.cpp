// What the JSON constraint costs the sampler per token: sample() over a Qwen3-sized row (151,936 logits),
// free vs under response_format json_object, greedy and temperature 1, with logits that look like a random
// model's (nearly flat: the worst case, most draws are rejected at structural positions) or a trained one's
// (peaked on a few tokens). Token table: the Qwen3 tokenizer in .cache/ (scripts/fetch-test-data.sh).
// Run from the source root: build/bench/bench_sampler
#include <benchmark/benchmark.h>

#include <random>

#include "engine/json_constraint.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

namespace moeserve {
namespace {

constexpr int64_t kVocab = 151936;
constexpr int32_t kEos = 151645;  // <|im_end|>

std::shared_ptr<const TokenBytes> table() {
  static const auto t = [] {
    const auto tok = text::Tokenizer::from_file(".cache/tokenizer-qwen3/tokenizer.json");
    auto t = std::make_shared<TokenBytes>();
    const size_t n = std::min<size_t>(tok.vocab_size(), kVocab);
    t->bytes.resize(n);
    t->usable.resize(n);
    for (size_t id = 0; id < n; ++id) {
      t->bytes[id] = tok.token_bytes(int32_t(id));
      t->usable[id] = !t->bytes[id].empty() && !tok.is_added(int32_t(id));
    }
    return std::shared_ptr<const TokenBytes>(std::move(t));
  }();
  return t;
}

// Eight rows to cycle through; peaked rows put most of the mass on a handful of random tokens.
std::vector<std::vector<float>> rows(bool peaked) {
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0, peaked ? 2.0f : 0.05f);
  std::vector<std::vector<float>> out(8, std::vector<float>(kVocab));
  for (auto& r : out) {
    for (float& l : r) l = noise(rng);
    if (peaked)
      for (int i = 0; i < 8; ++i) r[std::uniform_int_distribution<int>(0, kVocab - 1)(rng)] += 12.0f;
  }
  return out;
}

// Args: constrained (0/1), temperature x 10, peaked (0/1).
void BM_SampleToken(benchmark::State& state) {
  const bool constrained = state.range(0) != 0;
  SamplingParams p;
  p.temperature = float(state.range(1)) / 10.0f;
  if (constrained) {
    auto c = std::make_shared<JsonConstraint>();
    c->schema = JsonSchema::any_object();
    c->vocab = table();
    p.json = c;
  }
  const auto logits = rows(state.range(2) != 0);
  const std::vector<int32_t> prompt = {1};
  auto fresh = [&] {
    auto s = std::make_unique<Sampler>(p, prompt, 7);
    s->constrain({kEos});
    return s;
  };
  auto sampler = fresh();
  size_t step = 0, tokens = 0;
  for (auto _ : state) {
    const int32_t t = sampler->sample(logits[step++ % logits.size()], {});
    ++tokens;
    if (t == kEos || t == kNoToken || tokens % 256 == 0) sampler = fresh();  // a new document now and then
  }
  state.SetItemsProcessed(int64_t(tokens));
}
BENCHMARK(BM_SampleToken)
    ->ArgNames({"json", "temp_x10", "peaked"})
    ->ArgsProduct({{0, 1}, {0, 10}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
