#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "backend/backend.h"

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

// Candidates of a row as the backend reduces it (the CPU's reference op, which a GPU kernel must match).
LogitCandidates reduce(const std::vector<float>& logits, int k, float temperature) {
  static auto cpu = make_cpu_backend();
  std::vector<float> record(size_t(logits_topk_record_floats(k)));
  const float t = temperature > 0 ? temperature : 1.0f;
  cpu->logits_topk(logits.data(), 1, int64_t(logits.size()), std::span<const float>(&t, 1), k, record.data());
  return read_logit_candidates(record.data(), k, int64_t(logits.size()));
}

// Sampling from a row's candidates (fetching the row only when they cannot decide) draws exactly the tokens
// and logprobs that sampling from full rows does, for every kind of request, with the same seed.
TEST(Sampler, CandidatesGiveTheFullRowTokensAndLogprobs) {
  std::mt19937 rng(5);
  int decided = 0, fetched = 0;
  for (float temperature : {0.0f, 0.7f, 1.0f, 1.5f})
    for (int top_k : {0, 1, 10, 300})
      for (float top_p : {1.0f, 0.95f, 0.5f})
        for (float min_p : {0.0f, 0.1f})
          for (int k : {16, 64, 256})
            for (int variant : {0, 1, 2}) {  // plain, eos banned (min_tokens), penalties
              SamplingParams p;
              p.temperature = temperature;
              p.top_k = top_k;
              p.top_p = top_p;
              p.min_p = min_p;
              if (variant == 2) p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f;
              SCOPED_TRACE(testing::Message()
                           << "T=" << temperature << " top_k=" << top_k << " top_p=" << top_p
                           << " min_p=" << min_p << " k=" << k << " variant=" << variant);
              const std::vector<int32_t> prompt = {3, 5, 8};
              Sampler full(p, prompt, 99), cand(p, prompt, 99);
              for (int step = 0; step < 6; ++step) {
                // Peaked rows (a trained model's) and flat ones (the nucleus far past the candidates).
                auto logits = random_logits(3000, rng, step % 2 ? 6.0f : 0.5f);
                std::vector<int32_t> banned;
                if (variant == 1) banned = {int32_t(step * 7 % 3000), 11};
                if (variant == 1 && step == 4)  // the banned token is the likeliest
                  banned.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
                const int32_t want = full.sample(logits, banned);
                const LogitCandidates c = reduce(logits, k, temperature);
                std::optional<int32_t> got = cand.sample(c, banned);
                if (got) {
                  ++decided;
                } else {
                  ++fetched;
                  got = cand.sample(logits, banned);
                }
                ASSERT_EQ(*got, want) << "step " << step;
                auto lp = compute_logprobs(c, want, 5);
                if (lp) {
                  LogprobEntry ref = compute_logprobs(logits, want, 5);
                  EXPECT_EQ(lp->logprob, ref.logprob);
                  ASSERT_EQ(lp->top.size(), ref.top.size());
                  for (size_t i = 0; i < ref.top.size(); ++i) {
                    EXPECT_EQ(lp->top[i].token, ref.top[i].token);
                    EXPECT_EQ(lp->top[i].logprob, ref.top[i].logprob);
                  }
                }
              }
            }
  // Both ways were taken many times (penalties and flat rows need the row).
  EXPECT_GT(decided, 1000);
  EXPECT_GT(fetched, 1000);
}

TEST(Sampler, CandidatesCoveringTheWholeRowAreTheRow) {
  std::mt19937 rng(8);
  SamplingParams p;
  p.top_p = 0.9f;
  p.presence_penalty = 0.5f;
  Sampler full(p, {}, 3), cand(p, {}, 3);
  for (int step = 0; step < 20; ++step) {
    auto logits = random_logits(40, rng, 2.0f);
    const int32_t want = full.sample(logits, {});
    std::optional<int32_t> got = cand.sample(reduce(logits, 64, 1.0f), {});
    ASSERT_FALSE(got) << "penalties need the row";
    EXPECT_EQ(cand.sample(logits, {}), want);
  }
  p.presence_penalty = 0;
  Sampler full2(p, {}, 4), cand2(p, {}, 4);
  for (int step = 0; step < 20; ++step) {
    auto logits = random_logits(40, rng, 2.0f);
    std::optional<int32_t> got = cand2.sample(reduce(logits, 64, 1.0f), std::vector<int32_t>{1});
    ASSERT_TRUE(got) << "64 candidates of a 40-token row are the row";
    EXPECT_EQ(*got, full2.sample(logits, std::vector<int32_t>{1}));
  }
}

TEST(Sampler, GreedyFromCandidatesSkipsBannedTokens) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {}, 1);
  std::vector<float> l(100, 0.0f);
  l[7] = 5, l[3] = 4, l[9] = 4;
  LogitCandidates c = reduce(l, 4, 1.0f);
  EXPECT_EQ(s.sample(c, {}), 7);
  EXPECT_EQ(s.sample(c, std::vector<int32_t>{7}), 3);  // ties: the lower id
  EXPECT_EQ(s.sample(c, std::vector<int32_t>{7, 3}), 9);
  EXPECT_EQ(s.sample(c, std::vector<int32_t>{7, 3, 9, 0}), std::nullopt);  // all four candidates banned
}

TEST(Sampler, LogitBiasShiftsTheLogitsAndForcesTheCandidatesPathToTheRow) {
  std::mt19937 rng(13);
  auto logits = random_logits(3000, rng);
  const auto argmax = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const int32_t forced = argmax == 17 ? 18 : 17;
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{argmax, -100.0f}};
  // The greedy token banned by -100: the next best one comes up.
  std::vector<float> shifted = logits;
  shifted[size_t(argmax)] -= 100.0f;
  const auto second = int32_t(std::max_element(shifted.begin(), shifted.end()) - shifted.begin());
  EXPECT_NE(second, argmax);
  EXPECT_EQ(Sampler(p, {}, 1).sample(logits, {}), second);
  // +100 on an unlikely token makes it the greedy one; sampled at T=1 it carries nearly all the mass.
  p.logit_bias = {{forced, 100.0f}};
  EXPECT_EQ(Sampler(p, {}, 1).sample(logits, {}), forced);
  p.temperature = 1;
  auto dist = Sampler(p, {}, 1).distribution(logits, {});
  ASSERT_FALSE(dist.empty());
  EXPECT_EQ(dist[0].token, forced);
  EXPECT_GT(dist[0].prob, 0.999f);
  // The leading candidates were reduced without the bias: they cannot decide, the full row does.
  p.temperature = 0;
  Sampler cand(p, {}, 1);
  EXPECT_FALSE(cand.sample(reduce(logits, 64, 0.0f), {}));
  EXPECT_EQ(cand.sample(logits, {}), forced);
}

// A fake vocabulary for the JSON constraint: the model's favourite tokens are never valid JSON.
constexpr int32_t kEos = 9;
std::shared_ptr<const TokenBytes> json_vocab() {
  auto v = std::make_shared<TokenBytes>();
  v->bytes = {"x", "hello", "{", "}", "\"a\"", ":", "1", " ", "{\"a\": 2}", ""};
  v->usable = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0};  // 9: eos (special)
  return v;
}

SamplingParams json_params(float temperature, const char* schema) {
  SamplingParams p;
  p.temperature = temperature;
  auto c = std::make_shared<JsonConstraint>();
  c->schema = JsonSchema::compile(nlohmann::json::parse(schema));
  c->vocab = json_vocab();
  p.json = c;
  return p;
}

// Logits where "x" and "hello" lead, whitespace next, and the structural tokens trail.
std::vector<float> json_logits() {
  return {9, 8, 1, 1, 1, 1, 1, 6, 0.5, 2};
}

TEST(Sampler, GreedyUnderJsonTakesTheBestValidToken) {
  for (int k : {0, 2, 4}) {  // full rows, and candidates that hold no valid token
    SamplingParams p = json_params(0, R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                           "required": ["a"]})");
    Sampler s(p, std::vector<int32_t>{1}, 1);
    s.constrain({kEos});
    std::string text;
    int32_t t = -1;
    for (int step = 0; step < 400 && t != kEos; ++step) {
      std::optional<int32_t> c;
      if (k) c = s.sample(reduce(json_logits(), k, 1.0f), {});
      t = c ? *c : s.sample(json_logits(), {});
      ASSERT_NE(t, kNoToken);
      if (t != kEos) text += json_vocab()->bytes[size_t(t)];
    }
    EXPECT_EQ(t, kEos) << text;
    // The whitespace the logits prefer is capped, then the structure follows in order.
    const nlohmann::json doc = nlohmann::json::parse(text);
    EXPECT_TRUE(doc["a"].is_number_integer()) << text;
    EXPECT_TRUE(s.constraint_complete());
  }
}

// Rejection sampling draws from the model's distribution restricted to the valid tokens: at the start of a
// document, "{" (weight e^1), " " (e^6) and "{\"a\": 2}" (e^0.5).
TEST(Sampler, SamplingUnderJsonFollowsTheMaskedDistribution) {
  const std::vector<float> l = json_logits();
  const double w2 = std::exp(1.0), w7 = std::exp(6.0), w8 = std::exp(0.5), z = w2 + w7 + w8;
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Sampler s(json_params(1, R"({"type": "object"})"), std::vector<int32_t>{1}, uint64_t(i));
    s.constrain({kEos});
    ++counts[s.sample(l, {})];
  }
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_NEAR(counts[2] / double(n), w2 / z, 0.01);
  EXPECT_NEAR(counts[7] / double(n), w7 / z, 0.01);
  EXPECT_NEAR(counts[8] / double(n), w8 / z, 0.01);
}

// A complete document whose end token cannot come (ignore_eos: no end tokens) and whose whitespace ran out
// leaves nothing: the sampler says so instead of breaking the JSON.
TEST(Sampler, JsonWithNoWayOnIsADeadEnd) {
  Sampler s(json_params(0, R"({"type": "object"})"), std::vector<int32_t>{1}, 1);
  s.constrain({});
  EXPECT_EQ(s.sample(std::vector<float>{0, 0, 0, 5, 0, 0, 0, 0, 0, 9}, {}), 2);  // "{"
  EXPECT_EQ(s.sample(std::vector<float>{0, 0, 0, 5, 0, 0, 0, 0, 0, 9}, {}), 3);  // "}"
  EXPECT_TRUE(s.constraint_complete());
  int32_t t = 0;
  for (int i = 0; i <= kMaxWhitespaceRun && t != kNoToken; ++i) t = s.sample(json_logits(), {});
  EXPECT_EQ(t, kNoToken);
}

// With start_after_token (a reasoning model's </think>), tokens are free until that one, constrained after.
TEST(Sampler, JsonStartsAfterTheGateToken) {
  SamplingParams p = json_params(0, R"({"type": "object"})");
  auto c = std::make_shared<JsonConstraint>(*p.json);
  c->start_after_token = 1;  // "hello"
  p.json = c;
  Sampler s(p, std::vector<int32_t>{1}, 1);
  s.constrain({kEos});
  EXPECT_EQ(s.sample(json_logits(), {}), 0);  // "x": free
  EXPECT_EQ(s.sample(std::vector<float>{0, 9, 0, 0, 0, 0, 0, 0, 0, 0}, {}), 1);
  EXPECT_EQ(s.sample(json_logits(), {}), 7);  // now only JSON: " " leads
}
// A control token (an added token such as </tool_call>) is chosen only where the matcher takes its text:
// after the value, as the schema's suffix, and then the end.
TEST(Sampler, ControlTokensOnlyWhereTheSuffixTakesThem) {
  auto v = std::make_shared<TokenBytes>(*json_vocab());
  v->bytes.push_back("</tool_call>");  // 10: an added token
  v->usable.push_back(0);
  v->bytes.push_back("\n");  // 11
  v->usable.push_back(1);
  SamplingParams p;
  p.temperature = 0;
  auto c = std::make_shared<JsonConstraint>();
  c->schema = JsonSchema::tool_call(
      {{"f", nlohmann::json::parse(
                 R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})")}},
      JsonSchema::CallFormat::kHermes, true);
  c->vocab = v;
  c->control_tokens = {10};
  p.json = c;
  Sampler s(p, std::vector<int32_t>{1}, 1);
  s.constrain({kEos});
  std::vector<float> logits = json_logits();
  logits.push_back(20);  // the model wants </tool_call> most of all
  logits.push_back(0);
  std::string text;
  int32_t t = -1;
  for (int step = 0; step < 400 && t != kEos; ++step) {
    t = s.sample(logits, {});
    ASSERT_NE(t, kNoToken) << text;
    if (t != kEos) text += v->bytes[size_t(t)];
  }
  EXPECT_EQ(t, kEos) << text;
  ASSERT_TRUE(text.ends_with("}\n</tool_call>")) << text;
  const nlohmann::json args =
      nlohmann::json::parse(text.substr(0, text.size() - std::string("}\n</tool_call>").size()));
  EXPECT_TRUE(args["a"].is_number_integer()) << text;
  // Without the control token listed, it is never chosen: the suffix is then unreachable in this vocabulary.
  auto closed = std::make_shared<JsonConstraint>(*c);
  closed->control_tokens.clear();
  p.json = closed;
  Sampler s2(p, std::vector<int32_t>{1}, 1);
  s2.constrain({kEos});
  for (int step = 0; step < 400 && t != kNoToken; ++step) {
    t = s2.sample(logits, {});
    EXPECT_NE(t, 10);
  }
}

}  // namespace
}  // namespace moeserve
