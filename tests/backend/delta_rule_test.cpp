// The chunked (prefill) and recurrent (decode) gated delta rule compute the same thing.
#include "backend/cpu/delta_rule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "naive.h"

namespace moeserve {
namespace {

struct HeadData {
  int64_t T;
  int dk, dv;
  std::vector<float> q, k, v, g, beta;
  HeadData(int64_t T_, int dk_, int dv_, uint32_t seed) : T(T_), dk(dk_), dv(dv_) {
    q = testing::random_vector(size_t(T * dk), seed);
    k = testing::random_vector(size_t(T * dk), seed + 1);
    v = testing::random_vector(size_t(T * dv), seed + 2);
    auto a = testing::random_vector(size_t(T), seed + 3), b = testing::random_vector(size_t(T), seed + 4);
    // l2-normalised q, k as the backend passes them; decays in (-∞, 0], betas in (0, 1)
    for (int64_t t = 0; t < T; ++t) {
      double nq = 0, nk = 0;
      for (int i = 0; i < dk; ++i) nq += q[t * dk + i] * q[t * dk + i], nk += k[t * dk + i] * k[t * dk + i];
      for (int i = 0; i < dk; ++i) q[t * dk + i] /= float(std::sqrt(nq) * std::sqrt(dk)), k[t * dk + i] /= float(std::sqrt(nk));
      g.push_back(-float(std::log1p(std::exp(a[t]))) * 0.5f);
      beta.push_back(float(testing::sigmoid(b[t])));
    }
  }
  cpu::DeltaRuleHead head(float* out, int64_t from = 0) {
    return {q.data() + from * dk, k.data() + from * dk, dk, v.data() + from * dv, dv, g.data() + from,
            beta.data() + from, 1, out + from * dv, dv};
  }
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " at " << i;
}

class DeltaRule : public ::testing::TestWithParam<int64_t> {};

TEST_P(DeltaRule, ChunkedEqualsRecurrentIncludingFinalState) {
  const int64_t T = GetParam();
  HeadData d(T, 16, 8, 40 + uint32_t(T));
  std::vector<float> out_r(size_t(T * d.dv)), out_c(out_r.size());
  auto S0 = testing::random_vector(size_t(d.dk * d.dv), 7, 0.3f);  // a non-zero starting state (a cache hit)
  auto S_r = S0, S_c = S0;
  cpu::delta_rule_recurrent(d.head(out_r.data()), T, d.dk, d.dv, S_r.data());
  cpu::delta_rule_chunked(d.head(out_c.data()), T, d.dk, d.dv, S_c.data(), 64);
  expect_close(out_c, out_r, 2e-5f, "output");
  expect_close(S_c, S_r, 2e-5f, "state");
}

// Lengths below, at and across the 64-token chunk boundary, odd lengths included.
INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRule, ::testing::Values(1, 2, 17, 63, 64, 65, 129, 200));

TEST(DeltaRuleSplit, PrefillThenDecodeEqualsOnePass) {
  const int64_t T = 90;
  HeadData d(T, 8, 12, 3);
  std::vector<float> whole(size_t(T * d.dv)), split(whole.size()), S1(size_t(d.dk * d.dv), 0.0f), S2(S1);
  cpu::delta_rule_recurrent(d.head(whole.data()), T, d.dk, d.dv, S1.data());
  cpu::delta_rule_chunked(d.head(split.data()), 70, d.dk, d.dv, S2.data(), 64);
  for (int64_t t = 70; t < T; ++t) cpu::delta_rule_recurrent(d.head(split.data(), t), 1, d.dk, d.dv, S2.data());
  expect_close(split, whole, 2e-5f, "output");
  expect_close(S2, S1, 2e-5f, "state");
}

TEST(DeltaRuleSplit, RecurrenceMatchesTheDefinitionStepByStep) {
  HeadData d(3, 2, 2, 9);
  std::vector<float> out(6), S(4, 0.0f);
  cpu::delta_rule_recurrent(d.head(out.data()), 3, 2, 2, S.data());
  // Written out by hand: S = S e^g; δ = (v − Sᵀk) β; S += k δᵀ; o = Sᵀ q.
  double R[2][2] = {{0, 0}, {0, 0}};
  for (int t = 0; t < 3; ++t) {
    double e = std::exp(d.g[t]);
    for (auto& row : R)
      for (double& x : row) x *= e;
    double delta[2];
    for (int j = 0; j < 2; ++j)
      delta[j] = (d.v[t * 2 + j] - (R[0][j] * d.k[t * 2] + R[1][j] * d.k[t * 2 + 1])) * d.beta[t];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) R[i][j] += d.k[t * 2 + i] * delta[j];
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(out[t * 2 + j], R[0][j] * d.q[t * 2] + R[1][j] * d.q[t * 2 + 1], 1e-6);
  }
}

}  // namespace
}  // namespace moeserve
