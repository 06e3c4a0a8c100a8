// The Qwen3.5 forward pass on the CUDA backend against the CPU backend, with random weights of the
// small-moe-realdims shape (head_dim 256, GDN heads of 128): prefill logits, greedy decode through the caches
// (recorded and replayed as CUDA graphs after the first steps), batched == alone, and a cache-hit resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "dummy_model.h"
#include "model/qwen35.h"
#include "model/sequence.h"

namespace moeserve {
namespace {

using testing::rel_error;

class CudaModel : public ::testing::Test {
 protected:
  void SetUp() override {
    MOESERVE_REQUIRE_GPU();
    config = dummy::moe_config("small", 4);
    weights = dummy::random_weights(config, [&](int64_t rows, int64_t cols, float bound) {
      return store.make(DType::BF16, rows, cols, seed++, bound / 1.7f);
    });
  }
  std::vector<int32_t> prompt(size_t n, uint32_t s) const {
    std::vector<int32_t> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = int32_t((i * 7919 + s * 104729) % config.vocab_size);
    return ids;
  }
  testing::WeightStore store;
  uint32_t seed = 1;
  ModelConfig config;
  ModelWeights weights;
};

TEST_F(CudaModel, PrefillAndGreedyDecodeMatchCpu) {
  auto cpu = make_cpu_backend();
  Qwen35Model cpu_model(weights, *cpu);
  for (bool fp32 : {true, false}) {
    auto gpu = make_backend("cuda", {.fp32_matmul = fp32});
    Qwen35Model gpu_model(weights, *gpu);
    // fp32 matmuls agree with the CPU to float32 rounding; bf16 tensor cores (prefill) round activations.
    const double tol = fp32 ? 1e-4 : 3e-2;
    SequenceRunner cr(cpu_model, 128), gr(gpu_model, 128);
    auto ids = prompt(50, 1);
    auto cl = cr.prefill(ids, true).logits, gl = gr.prefill(ids, true).logits;
    // bf16: the median position (a near-tied top-k can flip on rounding and move single positions).
    std::vector<double> row_err;
    const size_t V = size_t(config.vocab_size);
    for (size_t r = 0; r < ids.size(); ++r)
      row_err.push_back(rel_error(std::vector<float>(gl.begin() + r * V, gl.begin() + (r + 1) * V),
                                  std::vector<float>(cl.begin() + r * V, cl.begin() + (r + 1) * V)));
    std::nth_element(row_err.begin(), row_err.begin() + long(row_err.size() / 2), row_err.end());
    if (fp32)
      EXPECT_LT(rel_error(gl, cl), tol) << "prefill";
    else
      EXPECT_LT(row_err[row_err.size() / 2], tol) << "prefill, median position";
    std::vector<float> c_last(cl.end() - config.vocab_size, cl.end());
    for (int step = 0; step < 12; ++step) {  // the decode graph is measured, recorded, then replayed
      const int32_t next = argmax(c_last);
      auto cd = cr.decode(next), gd = gr.decode(next);
      if (fp32) EXPECT_LT(rel_error(gd, cd), 1e-4) << "decode step " << step;
      // bf16: the caches came from a rounded prefill; greedy choices must agree.
      else
        EXPECT_EQ(argmax(gd), argmax(cd)) << "decode step " << step;
      c_last = cd;
    }
  }
}

TEST_F(CudaModel, BatchedEqualsAloneAndResumeEqualsFullPrefill) {
  auto gpu = make_backend("cuda", {.fp32_matmul = true});
  Qwen35Model model(weights, *gpu);
  const int page_size = 16;
  KvCache kv(model.kv_cache_spec(page_size, 40));
  StateCache state(model.state_cache_spec(4));
  std::vector<int32_t> pages_a(20), pages_b(20);
  std::iota(pages_a.begin(), pages_a.end(), 0);
  std::iota(pages_b.begin(), pages_b.end(), 20);
  auto a = prompt(37, 2), b = prompt(21, 3);

  // Alone: a, then b, each in its own forward.
  SequenceStep sa{a, 0, pages_a, 0, true}, sb{b, 0, pages_b, 1, true};
  auto la = model.forward({&sa, 1}, kv, state).logits;
  auto lb = model.forward({&sb, 1}, kv, state).logits;
  // Batched: both in one forward (slots 2 and 3, the same pages rewritten).
  SequenceStep both[2] = {{a, 0, pages_a, 2, true}, {b, 0, pages_b, 3, true}};
  auto lab = model.forward(both, kv, state).logits;
  std::vector<float> alone = la;
  alone.insert(alone.end(), lb.begin(), lb.end());
  EXPECT_LT(rel_error(lab, alone), 1e-5);

  // Resume: the first 16 tokens of a from the cache (pages and a snapshot of the state), then the rest.
  StateCache snap(model.state_cache_spec(2));
  SequenceStep head{std::span(a).first(16), 0, pages_a, 0, false};
  model.forward({&head, 1}, kv, snap);
  SequenceStep tail{std::span(a).subspan(16), 16, pages_a, 0, true};
  auto lt = model.forward({&tail, 1}, kv, snap).logits;
  std::vector<float> full_tail(la.begin() + 16 * config.vocab_size, la.end());
  EXPECT_LT(rel_error(lt, full_tail), 1e-4);
}

}  // namespace
}  // namespace moeserve
