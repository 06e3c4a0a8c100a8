// bf16 and FP8 KV caches against the float32 one on the real forward pass, teacher-forced along the float32
// greedy path for 500 decode steps: how often the greedy choice stays the same, and how far the logits move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/qwen35.h"
#include "model/sequence.h"

namespace moeserve {
namespace {

// Prefill `prompt`, then decode `continuation` one token at a time through a KV cache of `dtype`; every
// step's logits row (the prefill's last row first).
std::vector<std::vector<float>> forced_logits(const Qwen35Model& model, DType dtype,
                                              const std::vector<int32_t>& prompt,
                                              const std::vector<int32_t>& continuation) {
  SequenceRunner runner(model, int64_t(prompt.size() + continuation.size()) + 1, 16, dtype);
  std::vector<std::vector<float>> rows;
  rows.push_back(runner.prefill(prompt).logits);
  for (int32_t token : continuation) rows.push_back(runner.decode(token));
  return rows;
}

TEST(KvCacheDtype, GreedyAgreementOverFiveHundredDecodeStepsOnTheRealdimsFixtures) {
  for (std::string name : {"small-moe-realdims", "small-moe-realdims-fp8"}) {
    SCOPED_TRACE(name);
    ModelWeights weights = load_checkpoint("tests/fixtures/models/" + name);
    auto backend = make_cpu_backend();
    Qwen35Model model(weights, *backend);
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(32);
    for (auto& t : prompt) t = std::uniform_int_distribution<int>(0, int(weights.config.vocab_size) - 1)(rng);
    const int steps = 500;
    SequenceRunner runner(model, int64_t(prompt.size()) + steps + 1);
    const auto continuation = runner.generate_greedy(prompt, steps);  // float32 KV
    const auto f32 = forced_logits(model, DType::F32, prompt, continuation);
    ASSERT_EQ(f32.size(), size_t(steps) + 1);
    for (auto [dtype, min_agree, max_median] :
         {std::tuple{DType::BF16, 0.98, 2e-3}, std::tuple{DType::F8_E4M3, 0.97, 2e-2}}) {
      const auto got = forced_logits(model, dtype, prompt, continuation);
      int agree = 0;
      std::vector<double> diffs;  // per step: max |Δlogit| over the row
      for (size_t i = 0; i < f32.size(); ++i) {
        double d = 0;
        for (size_t v = 0; v < f32[i].size(); ++v) d = std::max(d, double(std::abs(f32[i][v] - got[i][v])));
        diffs.push_back(d);
        agree += argmax(f32[i]) == argmax(got[i]);
      }
      std::nth_element(diffs.begin(), diffs.begin() + long(diffs.size() / 2), diffs.end());
      const double median = diffs[diffs.size() / 2], rate = double(agree) / double(f32.size());
      std::printf("%s KV %s: greedy agreement %d/%zu (%.1f%%), median max|dlogit| %.3e, worst %.3e\n",
                  name.c_str(), std::string(kv_cache_dtype_name(dtype)).c_str(), agree, f32.size(),
                  100 * rate, median, *std::max_element(diffs.begin(), diffs.end()));
      EXPECT_GT(median, 0.0);  // the cache really is rounded
      EXPECT_LT(median, max_median);
      EXPECT_GE(rate, min_agree);
    }
  }
}

// The checkpoint's k_scale / v_scale reach an FP8 KV cache spec; bf16 and float32 caches ignore them.
TEST(KvCacheDtype, CheckpointScalesReachTheFp8CacheSpec) {
  ModelWeights weights = load_checkpoint("tests/fixtures/models/tiny-moe");
  auto backend = make_cpu_backend();
  float s = 0.5f;
  for (auto& l : weights.layers)
    if (l.type == LayerType::FullAttention) l.attn.k_scale = s, l.attn.v_scale = 2 * s, s *= 2;
  Qwen35Model model(weights, *backend);
  KvCache fp8(model.kv_cache_spec(16, 2, DType::F8_E4M3));
  ASSERT_GT(fp8.spec().num_layers, 0);
  EXPECT_EQ(fp8.k_scale(0), 0.5f);
  EXPECT_EQ(fp8.v_scale(0), 1.0f);
  KvCache bf16(model.kv_cache_spec(16, 2, DType::BF16));
  EXPECT_EQ(bf16.k_scale(0), 1.0f);
}

}  // namespace
}  // namespace moeserve
