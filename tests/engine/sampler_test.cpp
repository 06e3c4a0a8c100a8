#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace moeserve {
namespace {

// The textbook pipeline over the whole vocabulary: penalties, ban, softmax(l / T), sort, top-k, top-p, min-p.
std::map<int32_t, double> naive(std::vector<float> l, const SamplingParams& p,
                                const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                                const std::vector<int32_t>& banned) {
  const size_t V = l.size();
  for (size_t t = 0; t < V; ++t) {
    bool seen = std::count(prompt.begin(), prompt.end(), int32_t(t)) +
                std::count(output.begin(), output.end(), int32_t(t));
    if (seen) l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    auto count = std::count(output.begin(), output.end(), int32_t(t));
    l[t] -= p.frequency_penalty * float(count) + (count > 0 ? p.presence_penalty : 0.0f);
  }
  for (int32_t b : banned) l[size_t(b)] = -INFINITY;
  if (p.temperature == 0 || p.top_k == 1) {
    return {{int32_t(std::max_element(l.begin(), l.end()) - l.begin()), 1.0}};
  }
  std::vector<std::pair<double, int32_t>> probs;
  double mx = *std::max_element(l.begin(), l.end()), z = 0;
  for (size_t t = 0; t < V; ++t) z += std::exp((l[t] - mx) / p.temperature);
  for (size_t t = 0; t < V; ++t) probs.push_back({std::exp((l[t] - mx) / p.temperature) / z, int32_t(t)});
  std::sort(probs.begin(), probs.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0) probs.resize(std::min(V, size_t(p.top_k)));
  auto renorm = [&] {
    double s = 0;
    for (auto& [q, t] : probs) s += q;
    for (auto& [q, t] : probs) q /= s;
  };
  renorm();
  if (p.top_p < 1) {
    double acc = 0;
    size_t i = 0;
    while (i < probs.size() && acc < p.top_p) acc += probs[i++].first;
    probs.resize(std::max<size_t>(i, 1));
    renorm();
  }
  if (p.min_p > 0) {
    double thr = p.min_p * probs[0].first;
    std::erase_if(probs, [&](auto& e) { return e.first < thr; });
    renorm();
  }
  std::map<int32_t, double> out;
  for (auto& [q, t] : probs)
    if (q > 0) out[t] = q;
  return out;
}

std::vector<float> random_logits(size_t V, std::mt19937& rng, float scale = 3.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(V);
  for (auto& x : l) x = d(rng);
  return l;
}

void expect_same(const std::vector<TokenProb>& got, const std::map<int32_t, double>& want) {
  std::map<int32_t, double> g;
  for (auto& e : got) g[e.token] = e.prob;
  ASSERT_EQ(g.size(), want.size());
  for (auto& [t, q] : want) {
    ASSERT_TRUE(g.count(t)) << "token " << t;
    EXPECT_NEAR(g[t], q, 1e-5) << "token " << t;
  }
}

TEST(Sampler, GreedyTakesTheArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {}, 1);
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, FilteredDistributionMatchesNaivePipeline) {
  std::mt19937 rng(3);
  std::vector<int32_t> prompt = {1, 2, 3, 3}, output = {3, 7, 7, 9};
  for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f})
    for (int top_k : {0, 1, 5, 40})
      for (float top_p : {1.0f, 0.9f, 0.4f})
        for (float min_p : {0.0f, 0.05f, 0.3f})
          for (bool penalties : {false, true}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            if (penalties) {
              p.repetition_penalty = 1.3f;
              p.frequency_penalty = 0.4f;
              p.presence_penalty = 0.25f;
            }
            SCOPED_TRACE(testing::Message() << "T=" << temperature << " k=" << top_k << " p=" << top_p
                                            << " min_p=" << min_p << " penalties=" << penalties);
            Sampler s(p, prompt, 5);
            for (int32_t t : output) s.accept(t);
            auto logits = random_logits(64, rng);
            std::vector<int32_t> banned = {0};
            expect_same(s.distribution(logits, banned), naive(logits, p, prompt, output, banned));
          }
}

TEST(Sampler, NucleusWiderThanTheProbeStillMatches) {
  std::mt19937 rng(9);
  auto logits = random_logits(5000, rng, 0.1f);  // nearly flat: the 0.9 nucleus spans thousands of tokens
  SamplingParams p;
  p.top_p = 0.9f;
  Sampler s(p, {}, 1);
  expect_same(s.distribution(logits, {}), naive(logits, p, {}, {}, {}));
}

TEST(Sampler, EverythingBannedFallsBackToTheUnbannedDistribution) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {}, 1);
  std::vector<float> l = {1.0f, 3.0f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 1}), 1);
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{1}), 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::mt19937 rng(11);
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 64; ++i) rows.push_back(random_logits(100, rng, 1.0f));
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.top_p = 0.95f;
    Sampler s(p, {}, seed);
    std::vector<int32_t> out;
    for (auto& r : rows) out.push_back(s.sample(r, {}));
    return out;
  };
  EXPECT_EQ(run(1234), run(1234));
  EXPECT_NE(run(1234), run(4321));
}

TEST(Sampler, DrawFrequenciesFollowTheDistribution) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.8f;
  Sampler s(p, {}, 77);
  auto want = naive(l, p, {}, {}, {});
  std::map<int32_t, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(l, {})];
  for (auto& [t, q] : want) EXPECT_NEAR(double(counts[t]) / n, q, 0.01) << "token " << t;
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogitsWithSortedAlternatives) {
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 2.5f};
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  LogprobEntry e = compute_logprobs(l, 2, 3);
  EXPECT_EQ(e.token, 2);
  EXPECT_NEAR(e.logprob, -2.0 - std::log(z), 1e-5);
  ASSERT_EQ(e.top.size(), 3u);
  EXPECT_EQ(e.top[0].token, 1);
  EXPECT_EQ(e.top[1].token, 3);
  EXPECT_EQ(e.top[2].token, 0);
  EXPECT_NEAR(e.top[0].logprob, 3.0 - std::log(z), 1e-5);
}

}  // namespace
}  // namespace moeserve
