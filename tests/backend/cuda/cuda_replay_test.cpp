// The CUDA graph contract (Backend::run_step in backend.h), op by op. Each case runs the same steps on two
// backends: eagerly on one, through run_step with one key on the other (step 0 runs eagerly, step 1 is
// recorded, the later ones replay unless an argument baked into the recording changed). The steps change
// every host input (positions, page tables, token ids, temperatures, uploaded data) and, from kSwitchStep on,
// a state slot, a cache page or an output buffer too; each step's downloads must agree. An op that hands a
// kernel a host value it did not stage replays the recorded step's value, and one that leaves a baked-in
// argument out of the step's signature replays work on the old slot: either fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/logit_candidates.h"
#include "cuda_test_util.h"
#include "storage/kv_cache.h"

namespace moeserve {
namespace {

using namespace testing;  // moeserve::testing: cuda_test_util.h

constexpr int kSteps = 7;
constexpr int kSwitchStep = 4;  // from here on a slot, page or buffer is another one
constexpr uint64_t kKey = 11;
// The same kernels run in both: only a reduction whose order varies from launch to launch may differ.
constexpr double kSame = 1e-6;

class CudaReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    MOESERVE_REQUIRE_GPU();
    be[0] = make_backend("cuda");
    be[1] = make_backend("cuda");
  }

  // step(side, i): step i's ops on *be[side] (0: eager, 1: through run_step), returning what they downloaded.
  void expect_replays_like_eager(const std::function<std::vector<float>(int side, int i)>& step) {
    for (int i = 0; i < kSteps; ++i) {
      std::vector<float> want = step(0, i), got;
      landed(want);
      be[1]->run_step(kKey, [&] { got = step(1, i); });
      landed(got);
      ASSERT_FALSE(want.empty());
      EXPECT_LE(rel_error(got, want), kSame) << "step " << i;
    }
  }

  // Host results that land only when run_step returns (argmax's ids): `append` adds them to the step's vector
  // then, from storage the caller keeps alive until that point.
  void after_step(std::function<void(std::vector<float>&)> append) { after_.push_back(std::move(append)); }
  void landed(std::vector<float>& result) {
    for (auto& f : after_) f(result);
    after_.clear();
  }

  // A device copy of host data made inside the step (from the key's pool when recorded), downloaded by
  // download_all at the step's end.
  float* input(int side, const std::vector<float>& host) {
    return live_.emplace_back(to_device(*be[side], host)).get();
  }
  float* output(int side, size_t n) {
    float* p = live_.emplace_back(poisoned(*be[side], n)).get();
    outputs_.push_back({p, n});
    return p;
  }
  // Downloads the step's outputs (and any persistent state named) into one vector and frees its buffers.
  // Inside run_step a download lands when run_step returns, so every download goes straight into the
  // returned vector's final storage (sized once; moving the vector keeps it) and no temporary may hold one.
  std::vector<float> download_all(int side, std::vector<std::pair<const float*, size_t>> state = {}) {
    std::vector<std::pair<const float*, size_t>> all_parts(outputs_.begin(), outputs_.end());
    all_parts.insert(all_parts.end(), state.begin(), state.end());
    size_t total = 0;
    for (auto [p, n] : all_parts) total += n;
    std::vector<float> all(total);
    size_t at = 0;
    for (auto [p, n] : all_parts) be[side]->download(p, all.data() + at, n), at += n;
    outputs_.clear();
    live_.clear();
    return all;
  }

  std::unique_ptr<Backend> be[2];
  WeightStore store;
  std::deque<std::vector<float>> keep;  // weight vectors outlive the backends' copies of them

 private:
  std::deque<Buffer> live_;
  std::vector<std::pair<float*, size_t>> outputs_;
  std::vector<std::function<void(std::vector<float>&)>> after_;
};

TEST_F(CudaReplay, ElementwiseAndNorms) {
  const int64_t rows = 3, dim = 256, stride = 512;
  auto& w = keep.emplace_back(random_vector(dim, 1, 0.1f));
  auto& al = keep.emplace_back(random_vector(32, 2));
  auto& dt = keep.emplace_back(random_vector(32, 3));
  // Outputs that outlive the steps: the one written switches at kSwitchStep (a baked-in address).
  std::vector<Buffer> persistent[2];
  for (int side : {0, 1})
    for (int k = 0; k < 2; ++k) persistent[side].push_back(poisoned(*be[side], size_t(rows * dim)));
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    const uint32_t seed = uint32_t(100 + 10 * i);
    float* x = input(side, random_vector(size_t(rows * stride), seed));
    float* y = input(side, random_vector(size_t(rows * dim), seed + 1));
    float* g = input(side, random_vector(size_t(rows * dim), seed + 2));
    float* h = input(side, random_vector(size_t(rows * dim), seed + 3));
    float* norm = persistent[side][i >= kSwitchStep].get();
    b.rms_norm(x, rows, dim, stride, w.data(), 1e-6f, true, norm, dim);
    float* fused = output(side, size_t(rows * dim));
    b.add_rms_norm(h, y, rows, dim, w.data(), 1e-6f, fused);
    float* gated = output(side, size_t(rows * dim));
    b.gated_rms_norm(y, g, rows, dim, w.data(), 1e-6f, gated);
    b.add(y, g, size_t(rows * dim));
    b.mul_sigmoid(y, g, rows, dim / 2, dim);
    b.add_sigmoid_gated(h, y, g, rows, dim);
    float* copied = output(side, size_t(rows * dim));
    b.copy(h, copied, size_t(rows * dim));
    b.fill_zero(copied, 10);
    float* beta = output(side, 7 * 32);
    float* gate = output(side, 7 * 32);
    b.gdn_gates(input(side, random_vector(7 * 32, seed + 4)), input(side, random_vector(7 * 32, seed + 5)),
                al.data(), dt.data(), 7, 32, beta, gate);
    return download_all(side, {{norm, size_t(rows * dim)}});
  });
}

TEST_F(CudaReplay, RopeAtChangingPositions) {
  const int heads = 2, hd = 64, rot = 32;
  auto& inv_freq = keep.emplace_back();
  for (int j = 0; j < rot / 2; ++j) inv_freq.push_back(float(std::pow(1e4, -2.0 * j / rot)));
  for (int side : {0, 1}) be[side]->prepare(inv_freq.data(), inv_freq.size());
  expect_replays_like_eager([&](int side, int i) {
    const int64_t tokens = 3;
    float* q = output(side, size_t(tokens * heads * hd));
    be[side]->upload(random_vector(size_t(tokens * heads * hd), uint32_t(200 + i)).data(), q,
                     size_t(tokens * heads * hd));
    be[side]->rope(q, tokens, heads, hd, rot, 1000 * i + 7, inv_freq.data());
    return download_all(side);
  });
}

TEST_F(CudaReplay, EmbedArgmaxAndLogitsTopk) {
  Matrix table = store.make(DType::BF16, 1000, 256, 20);
  const int64_t rows = 3, cols = 5000;
  const int k = 20;
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    std::vector<int32_t> tokens = {int32_t(7 * i), int32_t(999 - i), int32_t(i * i)};
    float* e = output(side, tokens.size() * 256);
    b.embed(tokens, table, e);
    float* x = input(side, random_vector(size_t(rows * cols), uint32_t(300 + i)));
    const std::vector<float> temps = {0.5f + 0.1f * float(i), 1.0f, 2.0f - 0.2f * float(i)};
    float* topk = output(side, size_t(rows * logits_topk_record_floats(k)));
    b.logits_topk(x, rows, cols, temps, k, topk);
    auto ids = std::make_shared<std::vector<int32_t>>(rows);
    b.argmax(x, rows, cols, ids->data());
    after_step([ids](std::vector<float>& out) {
      for (int32_t id : *ids) out.push_back(float(id));
    });
    return download_all(side);
  });
}

TEST_F(CudaReplay, MatmulsOfEveryDtype) {
  const int64_t cols = 256;
  std::vector<Matrix> ws;
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3})
    ws.push_back(store.make(dt, 384, cols, uint32_t(ws.size() + 40)));
  Matrix second = store.make(DType::BF16, 130, cols, 45);
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    for (int64_t n : {1, 3}) {
      float* x = input(side, random_vector(size_t(n * cols), uint32_t(400 + 10 * i + n)));
      // From kSwitchStep on, another weight of the same shape (a baked-in argument).
      for (size_t m = 0; m < ws.size(); ++m) {
        const Matrix& w = ws[i >= kSwitchStep ? (m + 1) % ws.size() : m];
        b.matmul(x, n, w, output(side, size_t(n * w.rows)));
      }
      const Matrix* pair[] = {&ws[0], &second};
      float* ys[] = {output(side, size_t(n * ws[0].rows)), output(side, size_t(n * second.rows))};
      b.matmul_n(x, n, pair, ys);
    }
    // A matrix of few outputs at 96 rows: cuBLAS's SGEMM over the float32 copy the first (eager) step made.
    const int64_t n = 96;
    float* x = input(side, random_vector(size_t(n * cols), uint32_t(900 + i)));
    b.matmul(x, n, second, output(side, size_t(n * second.rows)));
    return download_all(side);
  });
}

TEST_F(CudaReplay, SwigluMoeExpertsAndMoeBlock) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    SCOPED_TRACE(dtype_name(dt));
    const int E = 16, top_k = 4;
    const int64_t hidden = 256, inter = 128;
    std::vector<SwiGlu> experts;
    for (int e = 0; e < E; ++e)
      experts.push_back({store.make(dt, inter, hidden, uint32_t(1000 + 3 * e), 0.05f),
                         store.make(dt, inter, hidden, uint32_t(1001 + 3 * e), 0.05f),
                         store.make(dt, hidden, inter, uint32_t(1002 + 3 * e), 0.05f)});
    Matrix router = store.make(DType::BF16, E, hidden, 1900, 0.1f);
    Matrix shared_gate = store.make(DType::BF16, 1, hidden, 1901, 0.1f);
    SwiGlu shared = {store.make(dt, 96, hidden, 1902, 0.05f), store.make(dt, 96, hidden, 1903, 0.05f),
                     store.make(dt, hidden, 96, 1904, 0.05f)};
    expect_replays_like_eager([&](int side, int i) {
      Backend& b = *be[side];
      const int64_t n = 3;
      const uint32_t seed = uint32_t(500 + 10 * i);
      float* x = input(side, random_vector(size_t(n * hidden), seed));
      b.swiglu(experts[size_t(i >= kSwitchStep)], x, n, output(side, size_t(n * hidden)));
      // The routing comes from the device data, so it changes every step without the host knowing.
      float* logits = input(side, random_vector(size_t(n * E), seed + 1));
      b.moe_experts(experts, logits, top_k, true, x, n, hidden, output(side, size_t(n * hidden)));
      b.moe_block(router, experts, top_k, true, &shared, &shared_gate, x, n, hidden,
                  output(side, size_t(n * hidden)));
      return download_all(side);
    });
  }
}

TEST_F(CudaReplay, PagedAttentionAndAttentionDecodeOverChangingPagesAndPositions) {
  const int heads = 4, kv_heads = 2, hd = 64, rotary = 32, page_size = 16;
  const int64_t num_pages = 24, prompt = 20;
  auto& q_norm = keep.emplace_back(random_vector(hd, 70, 0.1f));
  auto& k_norm = keep.emplace_back(random_vector(hd, 71, 0.1f));
  auto& inv_freq = keep.emplace_back();
  for (int j = 0; j < rotary / 2; ++j) inv_freq.push_back(float(std::pow(1e7, -2.0 * j / rotary)));
  std::vector<std::unique_ptr<KvCache>> kv;
  // Two sequences: a's pages, and b's, whose second page (positions 16..31) moves to a free one at
  // kSwitchStep, as a copy-on-write does, and the old page is cleared: a replay with the old page table reads
  // zeros.
  std::vector<int32_t> a_pages = {5, 3, 9, 1}, b_pages = {0, 7, 2, 11};
  for (int side : {0, 1}) {
    kv.push_back(std::make_unique<KvCache>(
        KvCacheSpec{1, kv_heads, hd, page_size, num_pages, be[side]->cache_memory()}));
    for (const auto* pages : {&a_pages, &b_pages}) {  // the prompts, outside any recorded step
      auto q = random_vector(size_t(prompt * heads * hd), 72),
           k = random_vector(size_t(prompt * kv_heads * hd), 73),
           v = random_vector(size_t(prompt * kv_heads * hd), 74);
      auto qd = to_device(*be[side], q), kd = to_device(*be[side], k), vd = to_device(*be[side], v);
      auto od = poisoned(*be[side], q.size());
      be[side]->paged_attention(qd.get(), kd.get(), vd.get(), prompt, heads, kv_heads, hd, 0, *pages,
                                *kv[size_t(side)], 0, od.get());
    }
  }
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    KvCache& cache = *kv[size_t(side)];
    std::vector<int32_t> b_now = b_pages;
    if (i >= kSwitchStep) b_now[1] = 20;
    if (i == kSwitchStep) {
      const size_t page = size_t(cache.spec().layer_page_bytes()) / sizeof(float);  // float32 pages
      b.copy(cache.keys(0, b_pages[1]), cache.keys(0, 20), page);
      b.copy(cache.values(0, b_pages[1]), cache.values(0, 20), page);
      b.fill_zero(cache.keys(0, b_pages[1]), page);
      b.fill_zero(cache.values(0, b_pages[1]), page);
    }
    const uint32_t seed = uint32_t(600 + 10 * i);
    // One token of sequence a through paged_attention at its next position...
    const int64_t a_pos = prompt + 2 * i;
    float* out_a = output(side, size_t(heads * hd));
    b.paged_attention(input(side, random_vector(size_t(heads * hd), seed)),
                      input(side, random_vector(size_t(kv_heads * hd), seed + 1)),
                      input(side, random_vector(size_t(kv_heads * hd), seed + 2)), 1, heads, kv_heads, hd,
                      a_pos, a_pages, cache, 0, out_a);
    // ...then a decode step of both sequences, a's one position on; b rotates behind its cache index by an
    // M-RoPE offset that changes from step to step (a staged input like the positions).
    const std::vector<int64_t> positions = {a_pos + 1, prompt + i};
    const std::vector<int64_t> offsets = {0, -3 - 2 * i};
    const std::vector<std::span<const int32_t>> tables = {a_pages, b_now};
    float* out = output(side, size_t(2 * heads * hd));
    b.attention_decode(input(side, random_vector(size_t(2 * heads * 2 * hd), seed + 3)),
                       input(side, random_vector(size_t(2 * kv_heads * hd), seed + 4)),
                       input(side, random_vector(size_t(2 * kv_heads * hd), seed + 5)), 2, heads, kv_heads,
                       hd, q_norm.data(), k_norm.data(), 1e-6f, rotary, inv_freq.data(), positions, offsets,
                       tables, cache, 0, out);
    return download_all(side);
  });
}

// A decode step's recording outlives the growth of its sequences' page tables: the table stride it bakes in
// moves in powers of two, so 40 steps over positions 20..59 (two to four pages) are recorded once and replay
// 38 times, each equal to the eager step. Recorded per page, a long generation ran every 16th step eagerly
// and recorded it again.
TEST_F(CudaReplay, AttentionDecodeKeepsItsRecordingAsTablesGrow) {
  const int heads = 4, kv_heads = 2, hd = 64, rotary = 32, page_size = 16, steps = 40;
  const int64_t prompt = 20;
  auto& q_norm = keep.emplace_back(random_vector(hd, 80, 0.1f));
  auto& k_norm = keep.emplace_back(random_vector(hd, 81, 0.1f));
  auto& inv_freq = keep.emplace_back();
  for (int j = 0; j < rotary / 2; ++j) inv_freq.push_back(float(std::pow(1e7, -2.0 * j / rotary)));
  const std::vector<int32_t> all_pages = {6, 2, 9, 4};
  std::vector<std::unique_ptr<KvCache>> kv;
  for (int side : {0, 1}) {
    kv.push_back(
        std::make_unique<KvCache>(KvCacheSpec{1, kv_heads, hd, page_size, 12, be[side]->cache_memory()}));
    auto q = to_device(*be[side], random_vector(size_t(prompt * heads * hd), 82));
    auto k = to_device(*be[side], random_vector(size_t(prompt * kv_heads * hd), 83));
    auto v = to_device(*be[side], random_vector(size_t(prompt * kv_heads * hd), 84));
    auto o = poisoned(*be[side], size_t(prompt * heads * hd));
    be[side]->paged_attention(q.get(), k.get(), v.get(), prompt, heads, kv_heads, hd, 0,
                              std::span(all_pages).first(2), *kv[size_t(side)], 0, o.get());
  }
  const cuda_tools::GraphCounts before = cuda_tools::graph_counts(*be[1]);
  for (int i = 0; i < steps; ++i) {
    const int64_t pos = prompt + i;
    const std::vector<int64_t> positions = {pos}, offsets = {0};
    const std::vector<std::span<const int32_t>> tables = {
        std::span(all_pages).first(size_t(pos / page_size + 1))};
    const uint32_t seed = uint32_t(700 + 10 * i);
    std::vector<float> got[2];
    for (int side : {0, 1}) {
      auto run = [&] {
        float* out = output(side, size_t(heads * hd));
        be[side]->attention_decode(input(side, random_vector(size_t(heads * 2 * hd), seed)),
                                   input(side, random_vector(size_t(kv_heads * hd), seed + 1)),
                                   input(side, random_vector(size_t(kv_heads * hd), seed + 2)), 1, heads,
                                   kv_heads, hd, q_norm.data(), k_norm.data(), 1e-6f, rotary, inv_freq.data(),
                                   positions, offsets, tables, *kv[size_t(side)], 0, out);
        got[side] = download_all(side);
      };
      if (side == 0)
        run();
      else
        be[1]->run_step(kKey, run);
    }
    ASSERT_FALSE(got[0].empty());
    EXPECT_LE(rel_error(got[1], got[0]), kSame) << "step " << i << ", position " << pos;
  }
  const cuda_tools::GraphCounts after = cuda_tools::graph_counts(*be[1]);
  EXPECT_EQ(after.recordings - before.recordings, 1);
  EXPECT_EQ(after.replays - before.replays, steps - 2);  // step 0 runs eagerly, step 1 is recorded
}

// The vision tower's ops. rope_table runs inside a recorded step when a one-token chunk carries explicit
// M-RoPE positions; its tables are uploads, staged like any input. The segments move every step with the
// tile count kept, so only staged tiles tell the replay where each image ends.
TEST_F(CudaReplay, VisionTowerOpsOverChangingSegments) {
  const int heads = 2, hd = 72;
  const int64_t rows = 100, width = heads * hd, stride = 3 * width, dim = 64;
  auto& bias = keep.emplace_back(random_vector(size_t(dim), 80, 0.1f));
  auto& ln_w = keep.emplace_back(random_vector(size_t(dim), 81, 0.2f));
  auto& ln_b = keep.emplace_back(random_vector(size_t(dim), 82, 0.1f));
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    const uint32_t seed = uint32_t(900 + 10 * i);
    float* x = output(side, size_t(rows * dim));
    b.upload(random_vector(size_t(rows * dim), seed).data(), x, size_t(rows * dim));
    b.add_bias(x, bias.data(), rows, dim);
    float* normed = output(side, size_t(rows * dim));
    b.layer_norm(x, rows, dim, ln_w.data(), ln_b.data(), 1e-6f, normed);
    b.gelu(normed, size_t(rows * dim), true);
    float* qkv = output(side, size_t(rows * stride));
    b.upload(random_vector(size_t(rows * stride), seed + 1).data(), qkv, size_t(rows * stride));
    const float* cos = input(side, random_vector(size_t(rows * hd / 2), seed + 2));
    const float* sin = input(side, random_vector(size_t(rows * hd / 2), seed + 3));
    b.rope_table(qkv, rows, stride, heads, hd, hd, cos, sin);
    const std::vector<int64_t> starts = {0, 40 + 2 * i, rows};  // one 64-row tile per segment throughout
    b.segment_attention(qkv, qkv + width, qkv + 2 * width, stride, heads, hd, starts,
                        output(side, size_t(rows * width)));
    return download_all(side);
  });
}

TEST_F(CudaReplay, ConvDeltaRuleAndGdnDecodeOverChangingStateSlots) {
  const DeltaRuleShape s{2, 4, 32, 32};
  const int K = 4, slots = 4;
  const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, value_dim = int64_t(s.v_heads) * s.v_dim;
  const int64_t C = 2 * key_dim + value_dim;
  const size_t conv_n = size_t(C * (K - 1)), rec_n = size_t(s.v_heads) * s.k_dim * s.v_dim;
  auto& conv_w = keep.emplace_back(random_vector(size_t(C * K), 50));
  auto& a_log = keep.emplace_back(random_vector(size_t(s.v_heads), 51, 0.5f));
  auto& dt_bias = keep.emplace_back(random_vector(size_t(s.v_heads), 52));
  auto& norm_w = keep.emplace_back(random_vector(size_t(s.v_dim), 53, 0.1f));
  float* conv[2];
  float* rec[2];
  for (int side : {0, 1}) {  // the same starting state in each backend's cache memory
    CacheMemory& mem = *be[side]->cache_memory();
    conv[side] = mem.allocate_cache(conv_n * slots);
    rec[side] = mem.allocate_cache(rec_n * slots);
    be[side]->upload(random_vector(conv_n * slots, 54, 0.5f).data(), conv[side], conv_n * slots);
    be[side]->upload(random_vector(rec_n * slots, 55, 0.1f).data(), rec[side], rec_n * slots);
  }
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    const uint32_t seed = uint32_t(700 + 10 * i);
    // The prefill ops on slot 0, then on slot 3 from kSwitchStep (a device pointer passed by value).
    const int slot = i >= kSwitchStep ? 3 : 0;
    const int64_t T = 2;
    float* qkv = input(side, random_vector(size_t(T * C), seed));
    float* conv_out = output(side, size_t(T * C));
    b.causal_conv1d_silu(qkv, T, C, conv_w.data(), K, conv[side] + slot * conv_n, conv_out);
    std::vector<float> beta(size_t(T * s.v_heads)), g(beta.size());
    for (size_t j = 0; j < beta.size(); ++j)
      beta[j] = 0.5f + 0.01f * float(j + i), g[j] = -0.1f * float(j % 3);
    float* rule_out = output(side, size_t(T * value_dim));
    b.gated_delta_rule(s, conv_out, conv_out + key_dim, C, conv_out + 2 * key_dim, C, input(side, g),
                       input(side, beta), T, rec[side] + slot * rec_n, rule_out);
    // A decode step of two sequences whose slots swap every step (staged pointer arrays).
    const int64_t n = 2;
    std::vector<float*> cs, rs;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t sl = 1 + (j + i) % 2;
      cs.push_back(conv[side] + sl * conv_n), rs.push_back(rec[side] + sl * rec_n);
    }
    float* dec_out = output(side, size_t(n * value_dim));
    b.gdn_decode(s, input(side, random_vector(size_t(n * C), seed + 1)),
                 input(side, random_vector(size_t(n * value_dim), seed + 2)),
                 input(side, random_vector(size_t(n * s.v_heads), seed + 3)),
                 input(side, random_vector(size_t(n * s.v_heads), seed + 4)), n, conv_w.data(), K,
                 a_log.data(), dt_bias.data(), norm_w.data(), 1e-6f, cs, rs, dec_out);
    return download_all(side, {{conv[side], conv_n * slots}, {rec[side], rec_n * slots}});
  });
  for (int side : {0, 1}) {
    be[side]->cache_memory()->free_cache(conv[side]);
    be[side]->cache_memory()->free_cache(rec[side]);
  }
}

// A verify step's GDN core: two sequences whose lengths, rows, live slots and trail slots change every step
// (all staged), the trail slots moving to others from kSwitchStep.
TEST_F(CudaReplay, GdnVerifyOverChangingLengthsAndTrailSlots) {
  const DeltaRuleShape s{2, 4, 32, 32};
  const int K = 4, slots = 10;
  const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, value_dim = int64_t(s.v_heads) * s.v_dim;
  const int64_t C = 2 * key_dim + value_dim, rows = 5;
  const size_t conv_n = size_t(C * (K - 1)), rec_n = size_t(s.v_heads) * s.k_dim * s.v_dim;
  auto& conv_w = keep.emplace_back(random_vector(size_t(C * K), 60));
  auto& a_log = keep.emplace_back(random_vector(size_t(s.v_heads), 61, 0.5f));
  auto& dt_bias = keep.emplace_back(random_vector(size_t(s.v_heads), 62));
  auto& norm_w = keep.emplace_back(random_vector(size_t(s.v_dim), 63, 0.1f));
  float* conv[2];
  float* rec[2];
  for (int side : {0, 1}) {
    CacheMemory& mem = *be[side]->cache_memory();
    conv[side] = mem.allocate_cache(conv_n * slots);
    rec[side] = mem.allocate_cache(rec_n * slots);
    be[side]->upload(random_vector(conv_n * slots, 64, 0.5f).data(), conv[side], conv_n * slots);
    be[side]->upload(random_vector(rec_n * slots, 65, 0.1f).data(), rec[side], rec_n * slots);
  }
  expect_replays_like_eager([&](int side, int i) {
    Backend& b = *be[side];
    const uint32_t seed = uint32_t(900 + 10 * i);
    // Lengths 3 and 2, then 2 and 3 (5 rows, 3 trails either way); the live slots swap every step.
    const std::vector<int64_t> lengths = i % 2 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{3, 2};
    const std::vector<int64_t> first_rows = {0, lengths[0]};
    std::vector<float*> cs, rs, ct, rt;
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t sl = (j + i) % 2;
      cs.push_back(conv[side] + sl * conv_n), rs.push_back(rec[side] + sl * rec_n);
    }
    const int64_t trail_base = i >= kSwitchStep ? 6 : 2;
    for (int64_t t = 0; t < 3; ++t)
      ct.push_back(conv[side] + (trail_base + t) * conv_n),
          rt.push_back(rec[side] + (trail_base + t) * rec_n);
    float* out = output(side, size_t(rows * value_dim));
    b.gdn_verify(s, input(side, random_vector(size_t(rows * C), seed)),
                 input(side, random_vector(size_t(rows * value_dim), seed + 1)),
                 input(side, random_vector(size_t(rows * s.v_heads), seed + 2)),
                 input(side, random_vector(size_t(rows * s.v_heads), seed + 3)), first_rows, lengths,
                 conv_w.data(), K, a_log.data(), dt_bias.data(), norm_w.data(), 1e-6f, cs, rs, ct, rt, out);
    return download_all(side, {{conv[side], conv_n * slots}, {rec[side], rec_n * slots}});
  });
  for (int side : {0, 1}) {
    be[side]->cache_memory()->free_cache(conv[side]);
    be[side]->cache_memory()->free_cache(rec[side]);
  }
}

}  // namespace
}  // namespace moeserve
