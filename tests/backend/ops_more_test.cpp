// The CPU backend's remaining ops against scalar double-precision references written here: the gated norms
// and sigmoid gates, embedding, the dense SwiGLU MLP, the composite ops (matmul_n, moe_block with a shared
// expert, gdn_decode, attention_decode) and greedy argmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "common/error.h"
#include "naive.h"

namespace moeserve {
namespace {

using testing::Bf16Matrix;
using testing::random_vector;
using testing::sigmoid;
using testing::silu;

class CpuOpsAgainstScalar : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

double mean_square(const float* x, int64_t n) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += double(x[i]) * x[i];
  return ms / double(n);
}

TEST_F(CpuOpsAgainstScalar, GatedRmsNormScalesByTheWeightAndSiluOfTheGate) {
  const int64_t rows = 5, dim = 24;
  auto o = random_vector(size_t(rows * dim), 20), z = random_vector(size_t(rows * dim), 21, 2.0f);
  auto w = random_vector(dim, 22, 0.5f);
  for (auto& x : w) x += 1.0f;  // a plain weight (not zero-centred), around 1 as in the checkpoints
  std::vector<float> out(o.size());
  be->gated_rms_norm(o.data(), z.data(), rows, dim, w.data(), 1e-6f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    const double inv = 1 / std::sqrt(mean_square(o.data() + r * dim, dim) + 1e-6);
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = size_t(r * dim + i);
      ASSERT_NEAR(out[k], w[size_t(i)] * o[k] * inv * silu(z[k]), 1e-5) << r << "," << i;
    }
  }
  // A row of zeros stays finite (eps) and zero.
  std::vector<float> zeros(size_t(dim), 0.0f), zero_out(size_t(dim), 1.0f);
  be->gated_rms_norm(zeros.data(), z.data(), 1, dim, w.data(), 1e-6f, zero_out.data());
  for (float x : zero_out) EXPECT_EQ(x, 0.0f);
}

TEST_F(CpuOpsAgainstScalar, MulSigmoidReadsGateRowsAtTheirStride) {
  // The attention output gate: gate values sit every 2*dim floats, interleaved with the query.
  const int64_t rows = 4, dim = 8, stride = 2 * dim;
  auto x = random_vector(size_t(rows * dim), 23), gate = random_vector(size_t(rows * stride), 24, 3.0f);
  auto y = x;
  be->mul_sigmoid(y.data(), gate.data(), rows, dim, stride);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(y[size_t(r * dim + i)], x[size_t(r * dim + i)] * sigmoid(gate[size_t(r * stride + i)]),
                  1e-6)
          << r << "," << i;
}

TEST_F(CpuOpsAgainstScalar, AddSigmoidGatedAddsEachRowScaledByItsOwnGate) {
  const int64_t rows = 3, dim = 20;
  auto out = random_vector(size_t(rows * dim), 25), y = random_vector(size_t(rows * dim), 26);
  std::vector<float> gate = {-30.0f, 0.0f, 1.5f};  // off, half, mostly on
  auto before = out;
  be->add_sigmoid_gated(out.data(), y.data(), gate.data(), rows, dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = size_t(r * dim + i);
      ASSERT_NEAR(out[k], before[k] + sigmoid(gate[size_t(r)]) * y[k], 1e-6) << r << "," << i;
    }
}

TEST_F(CpuOpsAgainstScalar, AddRmsNormUpdatesTheResidualAndNormalisesIt) {
  const int64_t rows = 3, dim = 16;
  auto h = random_vector(size_t(rows * dim), 27), y = random_vector(size_t(rows * dim), 28);
  auto w = random_vector(dim, 29, 0.1f);
  auto h0 = h;
  std::vector<float> out(h.size());
  be->add_rms_norm(h.data(), y.data(), rows, dim, w.data(), 1e-6f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> sum(static_cast<size_t>(dim));
    double ms = 0;
    for (int64_t i = 0; i < dim; ++i) {
      sum[size_t(i)] = double(h0[size_t(r * dim + i)]) + y[size_t(r * dim + i)];
      ms += sum[size_t(i)] * sum[size_t(i)];
      ASSERT_NEAR(h[size_t(r * dim + i)], sum[size_t(i)], 1e-6);
    }
    const double inv = 1 / std::sqrt(ms / double(dim) + 1e-6);
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(out[size_t(r * dim + i)], sum[size_t(i)] * inv * (1 + w[size_t(i)]), 1e-5) << r << "," << i;
  }
}

TEST_F(CpuOpsAgainstScalar, EmbedCopiesTableRowsAndRejectsIdsOutsideTheVocabulary) {
  Bf16Matrix table(10, 12, 30);
  std::vector<int32_t> tokens = {9, 0, 9, 4};
  std::vector<float> out(tokens.size() * 12);
  be->embed(tokens, table.view, out.data());
  for (size_t t = 0; t < tokens.size(); ++t)
    for (size_t c = 0; c < 12; ++c) ASSERT_EQ(out[t * 12 + c], table.values[size_t(tokens[t]) * 12 + c]);
  std::vector<int32_t> bad = {3, 10};
  EXPECT_THROW(be->embed(bad, table.view, out.data()), Error);
  bad = {-1};
  EXPECT_THROW(be->embed(bad, table.view, out.data()), Error);
}

// down(silu(gate x) * up x), written out for every output element.
std::vector<double> naive_swiglu(const Bf16Matrix& gate, const Bf16Matrix& up, const Bf16Matrix& down,
                                 const std::vector<float>& x, int64_t n) {
  const int64_t hidden = gate.view.cols, inter = gate.view.rows, out_dim = down.view.rows;
  std::vector<double> out(size_t(n * out_dim));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> act(static_cast<size_t>(inter));
    for (int64_t j = 0; j < inter; ++j) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < hidden; ++c) {
        g += double(gate.values[size_t(j * hidden + c)]) * x[size_t(t * hidden + c)];
        u += double(up.values[size_t(j * hidden + c)]) * x[size_t(t * hidden + c)];
      }
      act[size_t(j)] = silu(g) * u;
    }
    for (int64_t o = 0; o < out_dim; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < inter; ++j) acc += double(down.values[size_t(o * inter + j)]) * act[size_t(j)];
      out[size_t(t * out_dim + o)] = acc;
    }
  }
  return out;
}

TEST_F(CpuOpsAgainstScalar, DenseSwigluMlpMatchesTheDefinition) {
  // Odd sizes (no SIMD-friendly multiple) and one row (decode) as well as several (prefill).
  for (auto [n, hidden, inter] : {std::tuple{1, 24, 40}, {7, 33, 59}}) {
    Bf16Matrix gate(inter, hidden, 31), up(inter, hidden, 32), down(hidden, inter, 33);
    auto x = random_vector(size_t(n * hidden), 34);
    std::vector<float> out(size_t(n * hidden));
    be->swiglu({gate.view, up.view, down.view}, x.data(), n, out.data());
    auto ref = naive_swiglu(gate, up, down, x, n);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << i;
  }
}

TEST_F(CpuOpsAgainstScalar, MatmulNGivesEachMatrixItsOwnProduct) {
  const int64_t n = 3, cols = 19;
  Bf16Matrix a(5, cols, 35), b(11, cols, 36);
  auto x = random_vector(size_t(n * cols), 37);
  std::vector<float> ya(size_t(n * 5)), yb(size_t(n * 11));
  const Matrix* ws[] = {&a.view, &b.view};
  float* ys[] = {ya.data(), yb.data()};
  be->matmul_n(x.data(), n, ws, ys);
  auto ra = testing::naive_matmul(x, n, a.values, 5, cols),
       rb = testing::naive_matmul(x, n, b.values, 11, cols);
  for (size_t i = 0; i < ya.size(); ++i) ASSERT_NEAR(ya[i], ra[i], 1e-5) << i;
  for (size_t i = 0; i < yb.size(); ++i) ASSERT_NEAR(yb[i], rb[i], 1e-5) << i;
  float* one[] = {ya.data()};
  EXPECT_THROW(be->matmul_n(x.data(), n, ws, one), Error);
}

TEST_F(CpuOpsAgainstScalar, MoeBlockAddsTheSigmoidGatedSharedExpertToTheRoutedMixture) {
  const int E = 4, top_k = 2;
  const int64_t hidden = 10, inter = 6, shared_inter = 8, n = 5;
  std::vector<Bf16Matrix> mats;
  mats.reserve(3 * E);
  std::vector<SwiGlu> experts;
  for (int e = 0; e < E; ++e) {
    mats.emplace_back(inter, hidden, 200 + 3 * e);
    mats.emplace_back(inter, hidden, 201 + 3 * e);
    mats.emplace_back(hidden, inter, 202 + 3 * e);
  }
  for (int e = 0; e < E; ++e)
    experts.push_back({mats[3 * e].view, mats[3 * e + 1].view, mats[3 * e + 2].view});
  Bf16Matrix router(E, hidden, 40, 1.0f), sg(shared_inter, hidden, 41), su(shared_inter, hidden, 42),
      sd(hidden, shared_inter, 43), shared_gate(1, hidden, 44);
  SwiGlu shared{sg.view, su.view, sd.view};
  auto x = random_vector(size_t(n * hidden), 45);

  for (bool renormalize : {true, false}) {
    std::vector<float> out(size_t(n * hidden));
    be->moe_block(router.view, experts, top_k, renormalize, &shared, &shared_gate.view, x.data(), n, hidden,
                  out.data());
    auto logits = testing::naive_matmul(x, n, router.values, E, hidden);
    auto shared_y = naive_swiglu(sg, su, sd, x, n);
    auto gate = testing::naive_matmul(x, n, shared_gate.values, 1, hidden);
    for (int64_t t = 0; t < n; ++t) {
      const double* l = logits.data() + t * E;
      std::vector<double> p(static_cast<size_t>(E));
      const double m = *std::max_element(l, l + E);
      double total = 0;
      for (int e = 0; e < E; ++e) total += (p[size_t(e)] = std::exp(l[e] - m));
      for (auto& v : p) v /= total;
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
      const double chosen = p[size_t(order[0])] + p[size_t(order[1])];
      std::vector<float> xt(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
      std::vector<double> want(static_cast<size_t>(hidden));
      for (int i = 0; i < top_k; ++i) {
        const int e = order[size_t(i)];
        const double weight = renormalize ? p[size_t(e)] / chosen : p[size_t(e)];
        auto y = naive_swiglu(mats[size_t(3 * e)], mats[size_t(3 * e + 1)], mats[size_t(3 * e + 2)], xt, 1);
        for (int64_t o = 0; o < hidden; ++o) want[size_t(o)] += weight * y[size_t(o)];
      }
      for (int64_t o = 0; o < hidden; ++o) {
        want[size_t(o)] += sigmoid(gate[size_t(t)]) * shared_y[size_t(t * hidden + o)];
        ASSERT_NEAR(out[size_t(t * hidden + o)], want[size_t(o)], 1e-5)
            << renormalize << " " << t << "," << o;
      }
    }
  }
  std::vector<float> out(size_t(n * hidden));
  EXPECT_THROW(
      be->moe_block(router.view, experts, top_k, true, &shared, nullptr, x.data(), n, hidden, out.data()),
      Error);
}

// One Gated DeltaNet decode step of one sequence in double precision: causal conv + SiLU over the conv state,
// gates, l2-normalised q/k, the delta rule on the recurrent state, then the gated RMSNorm. Advances the
// states it is given.
struct NaiveGdn {
  DeltaRuleShape s;
  int kernel;
  std::vector<float> conv_w, a_log, dt_bias, norm_w;
  std::vector<double> conv_state, state;  // [C][kernel-1], [Hv][dk][dv]

  std::vector<double> step(const float* qkv, const float* z, const float* b, const float* a) {
    const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, C = 2 * key_dim + int64_t(s.v_heads) * s.v_dim;
    std::vector<double> x(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      double acc = double(conv_w[size_t(c * kernel + kernel - 1)]) * qkv[c];
      for (int j = 0; j < kernel - 1; ++j)
        acc += double(conv_w[size_t(c * kernel + j)]) * conv_state[size_t(c * (kernel - 1) + j)];
      for (int j = 0; j + 1 < kernel - 1; ++j)
        conv_state[size_t(c * (kernel - 1) + j)] = conv_state[size_t(c * (kernel - 1) + j + 1)];
      conv_state[size_t(c * (kernel - 1) + kernel - 2)] = qkv[c];
      x[size_t(c)] = silu(acc);
    }
    std::vector<double> out(size_t(s.v_heads) * size_t(s.v_dim));
    const int ratio = s.v_heads / s.k_heads;
    for (int h = 0; h < s.v_heads; ++h) {
      const int kh = h / ratio;
      const double* q = x.data() + kh * s.k_dim;
      const double* k = x.data() + key_dim + kh * s.k_dim;
      const double* v = x.data() + 2 * key_dim + h * s.v_dim;
      double nq = 0, nk = 0;
      for (int i = 0; i < s.k_dim; ++i) nq += q[i] * q[i], nk += k[i] * k[i];
      std::vector<double> qn(static_cast<size_t>(s.k_dim)), kn(qn.size());
      for (int i = 0; i < s.k_dim; ++i) {
        qn[size_t(i)] = q[i] / std::sqrt(nq + 1e-6) / std::sqrt(double(s.k_dim));
        kn[size_t(i)] = k[i] / std::sqrt(nk + 1e-6);
      }
      const double ax = double(a[h]) + dt_bias[size_t(h)];
      const double g = -std::exp(double(a_log[size_t(h)])) * (ax > 20 ? ax : std::log1p(std::exp(ax)));
      const double beta = sigmoid(b[h]);
      double* S = state.data() + size_t(h) * size_t(s.k_dim) * size_t(s.v_dim);
      for (int i = 0; i < s.k_dim * s.v_dim; ++i) S[i] *= std::exp(g);
      for (int j = 0; j < s.v_dim; ++j) {
        double sk = 0;
        for (int i = 0; i < s.k_dim; ++i) sk += S[i * s.v_dim + j] * kn[size_t(i)];
        const double delta = (v[j] - sk) * beta;
        for (int i = 0; i < s.k_dim; ++i) S[i * s.v_dim + j] += kn[size_t(i)] * delta;
      }
      double* o = out.data() + h * s.v_dim;
      for (int j = 0; j < s.v_dim; ++j) {
        o[j] = 0;
        for (int i = 0; i < s.k_dim; ++i) o[j] += S[i * s.v_dim + j] * qn[size_t(i)];
      }
      double ms = 0;
      for (int j = 0; j < s.v_dim; ++j) ms += o[j] * o[j];
      const double inv = 1 / std::sqrt(ms / s.v_dim + 1e-6);
      for (int j = 0; j < s.v_dim; ++j) o[j] = norm_w[size_t(j)] * o[j] * inv * silu(z[h * s.v_dim + j]);
    }
    return out;
  }
};

TEST_F(CpuOpsAgainstScalar, GdnDecodeFollowsConvGatesDeltaRuleAndGatedNormStepByStep) {
  const DeltaRuleShape s{2, 4, 8, 6};
  const int kernel = 4, n = 2, steps = 5;
  const int64_t C = 2 * 2 * 8 + 4 * 6, value_dim = 4 * 6;
  NaiveGdn proto{s,
                 kernel,
                 random_vector(size_t(C * kernel), 50, 0.5f),
                 random_vector(4, 51, 0.5f),
                 random_vector(4, 52, 0.5f),
                 random_vector(6, 53, 0.2f),
                 {},
                 {}};
  for (auto& w : proto.norm_w) w += 1.0f;
  // Two sequences with different (non-zero) starting states, as after a prefix-cache hit.
  std::vector<NaiveGdn> ref(n, proto);
  std::vector<std::vector<float>> conv_states, states;
  for (int i = 0; i < n; ++i) {
    conv_states.push_back(random_vector(size_t(C * (kernel - 1)), 60 + uint32_t(i)));
    states.push_back(random_vector(size_t(4 * 8 * 6), 70 + uint32_t(i), 0.3f));
    ref[size_t(i)].conv_state.assign(conv_states.back().begin(), conv_states.back().end());
    ref[size_t(i)].state.assign(states.back().begin(), states.back().end());
  }
  for (int step = 0; step < steps; ++step) {
    auto qkv = random_vector(size_t(n * C), 80 + uint32_t(step)),
         z = random_vector(size_t(n * value_dim), 90 + uint32_t(step)),
         b = random_vector(size_t(n * 4), 100 + uint32_t(step)),
         a = random_vector(size_t(n * 4), 110 + uint32_t(step));
    std::vector<float> out(size_t(n * value_dim));
    float* cs[] = {conv_states[0].data(), conv_states[1].data()};
    float* ss[] = {states[0].data(), states[1].data()};
    be->gdn_decode(s, qkv.data(), z.data(), b.data(), a.data(), n, proto.conv_w.data(), kernel,
                   proto.a_log.data(), proto.dt_bias.data(), proto.norm_w.data(), 1e-6f, cs, ss, out.data());
    for (int i = 0; i < n; ++i) {
      auto want = ref[size_t(i)].step(qkv.data() + i * C, z.data() + i * value_dim, b.data() + i * 4,
                                      a.data() + i * 4);
      for (int64_t j = 0; j < value_dim; ++j)
        ASSERT_NEAR(out[size_t(i * value_dim + j)], want[size_t(j)], 1e-4) << "step " << step << " seq " << i;
      for (size_t j = 0; j < states[size_t(i)].size(); ++j)
        ASSERT_NEAR(states[size_t(i)][j], ref[size_t(i)].state[j], 1e-4) << "state " << step << " seq " << i;
      for (size_t j = 0; j < conv_states[size_t(i)].size(); ++j)
        ASSERT_EQ(conv_states[size_t(i)][j], float(ref[size_t(i)].conv_state[j]));
    }
  }
}

TEST_F(CpuOpsAgainstScalar, AttentionDecodeNormalisesRotatesCachesAndAttends) {
  // Two sequences decoded token by token from position 0 over their own scattered pages; the second rotates
  // 3 positions behind its cache index (M-RoPE's rope_delta after an image).
  const int heads = 4, kv_heads = 2, hd = 8, rotary = 4, page_size = 2, steps = 5, n = 2;
  const std::vector<int64_t> offsets = {0, -3};
  KvCache kv({1, kv_heads, hd, page_size, 8});
  const std::vector<std::vector<int32_t>> tables = {{5, 1, 7}, {0, 6, 2}};
  auto q_norm = random_vector(hd, 120, 0.1f), k_norm = random_vector(hd, 121, 0.1f);
  std::vector<float> inv_freq;
  for (int j = 0; j < rotary / 2; ++j) inv_freq.push_back(float(std::pow(10000.0, -2.0 * j / rotary)));

  // What the reference keeps per sequence: every position's normalised, rotated key and its value.
  std::vector<std::vector<std::vector<double>>> keys(n), values(n);
  auto norm_rope = [&](const float* x, const std::vector<float>& w, int64_t pos) {
    std::vector<double> y(static_cast<size_t>(hd));
    const double inv = 1 / std::sqrt(mean_square(x, hd) + 1e-6);
    for (int i = 0; i < hd; ++i) y[size_t(i)] = x[i] * inv * (1 + w[size_t(i)]);
    for (int j = 0; j < rotary / 2; ++j) {
      const double angle = double(pos) * inv_freq[size_t(j)], a = y[size_t(j)], b = y[size_t(j + rotary / 2)];
      y[size_t(j)] = a * std::cos(angle) - b * std::sin(angle);
      y[size_t(j + rotary / 2)] = b * std::cos(angle) + a * std::sin(angle);
    }
    return y;
  };
  for (int64_t pos = 0; pos < steps; ++pos) {
    auto qg = random_vector(size_t(n * heads * 2 * hd), 130 + uint32_t(pos)),
         k = random_vector(size_t(n * kv_heads * hd), 140 + uint32_t(pos)),
         v = random_vector(size_t(n * kv_heads * hd), 150 + uint32_t(pos));
    const auto k_in = k;
    std::vector<float> out(size_t(n * heads * hd));
    std::vector<int64_t> positions(n, pos);
    std::vector<std::span<const int32_t>> pages = {tables[0], tables[1]};
    be->attention_decode(qg.data(), k.data(), v.data(), n, heads, kv_heads, hd, q_norm.data(), k_norm.data(),
                         1e-6f, rotary, inv_freq.data(), positions, offsets, pages, kv, 0, out.data());
    for (int i = 0; i < n; ++i) {
      const int64_t rope_pos = pos + offsets[size_t(i)];
      for (int kh = 0; kh < kv_heads; ++kh) {
        keys[size_t(i)].push_back(norm_rope(k_in.data() + (i * kv_heads + kh) * hd, k_norm, rope_pos));
        values[size_t(i)].emplace_back(v.begin() + (i * kv_heads + kh) * hd,
                                       v.begin() + (i * kv_heads + kh + 1) * hd);
      }
      for (int h = 0; h < heads; ++h) {
        const int kh = h / (heads / kv_heads);
        auto q =
            norm_rope(qg.data() + (i * heads + h) * 2 * hd, q_norm, rope_pos);  // the gate half is not read
        std::vector<double> score;
        for (int64_t p = 0; p <= pos; ++p) {
          const auto& key = keys[size_t(i)][size_t(p * kv_heads + kh)];
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += q[size_t(d)] * key[size_t(d)];
          score.push_back(acc / std::sqrt(double(hd)));
        }
        const double m = *std::max_element(score.begin(), score.end());
        double total = 0;
        for (auto& x : score) total += (x = std::exp(x - m));
        for (int d = 0; d < hd; ++d) {
          double want = 0;
          for (int64_t p = 0; p <= pos; ++p)
            want += score[size_t(p)] / total * values[size_t(i)][size_t(p * kv_heads + kh)][size_t(d)];
          ASSERT_NEAR(out[size_t((i * heads + h) * hd + d)], want, 1e-5)
              << "pos " << pos << " seq " << i << " head " << h;
        }
      }
    }
  }
}

TEST_F(CpuOpsAgainstScalar, ArgmaxTakesTheFirstLargestValueOfEachRow) {
  const std::vector<float> x = {1,  5,  5,  -2,  // a tie: the first one
                                -7, -3, -9, -3,  // all negative
                                0,  0,  0,  0};
  std::vector<int32_t> out(3);
  be->argmax(x.data(), 3, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 0}));
}

}  // namespace
}  // namespace moeserve
