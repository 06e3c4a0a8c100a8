// Speculative decoding on the CUDA backend (engine/speculative.h): with the MTP layer's drafts verified on
// the GPU (verify rows reduced to logit candidates there, hidden rows kept there, the GDN trail states
// written by gdn_verify, float32 or bf16 slots), greedy output equals plain decoding on the same GPU token
// for token. The fixture's random MTP layer is almost always wrong, so an oracle that knows the plain
// continuation drafts instead (wrong every 4th position), taking every rollback depth. fp32 matmuls: a verify
// step's matmuls run over k+1 rows where decode runs one, and only float32 keeps both paths' logits within
// rounding of each other (bf16 tensor cores would round the verify rows' activations and may flip a
// near-tie).
#include <gtest/gtest.h>

#include <random>

#include "../../engine/oracle_drafts.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/model_runner.h"
#include "model/checkpoint.h"
#include "model/qwen35.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"

namespace moeserve {
namespace {

using engine_test::OracleDrafts;

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Outputs run(std::unique_ptr<ModelRunner> model, const EngineOptions& o,
            const std::vector<std::vector<int32_t>>& prompts) {
  EngineCore core(std::move(model), o);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 24 + int(i % 3) * 8;
    p.ignore_eos = true;
    GenerateRequest r{"r" + std::to_string(i), prompts[i], p, 0, {}};
    streams.push_back(std::make_shared<OutputStream>());
    r.on_output = streams.back()->sink();
    core.validate(r);
    core.add(std::move(r));
  }
  for (int step = 0; step < 5000 && !core.idle(); ++step) {
    core.step();
    core.deliver();
  }
  EXPECT_TRUE(core.idle());
  Outputs result;
  for (auto& s : streams) result.tokens.push_back(s->collect().tokens);
  result.stats = core.stats();
  return result;
}

TEST(CudaSpeculative, GreedyOutputEqualsPlainDecodingOnTheGpu) {
  MOESERVE_REQUIRE_GPU();
  ModelWeights weights = load_checkpoint("tests/fixtures/models/tiny-moe-mtp");
  auto gpu = make_backend("cuda", {.fp32_matmul = true});
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(size_t(5 + 9 * i));
    for (auto& t : p) t = std::uniform_int_distribution<int>(0, int(weights.config.vocab_size) - 1)(rng);
    prompts.push_back(p);
  }
  for (StateDtype state : {StateDtype::F32, StateDtype::BF16}) {
    SCOPED_TRACE(state == StateDtype::BF16 ? "bf16 state slots" : "float32 state slots");
    EngineOptions o;
    o.backend = gpu.get();
    o.page_size = 16;
    o.cache_memory_bytes = 64 << 20;
    // Two at a time: a verify batch is then at most 8 rows, which the matmuls and the MoE take through the
    // same few-row kernels as decode, so verified rows get a decode step's arithmetic.
    o.max_running_requests = 2;
    o.max_model_len = 256;
    o.state_dtype = state;
    const Outputs plain = run(make_qwen35_runner(weights, gpu.get()), o, prompts);
    o.speculative_num_steps = 3;
    o.speculative_adaptive = false;
    const Outputs own =
        run(make_qwen35_runner(weights, gpu.get()), o, prompts);  // the MTP layer's own drafts
    auto oracle = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, gpu.get()), 4);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto sequence = prompts[i];
      sequence.insert(sequence.end(), plain.tokens[i].begin(), plain.tokens[i].end());
      oracle->learn(sequence);
    }
    const Outputs drafted = run(std::move(oracle), o, prompts);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(own.tokens[i], plain.tokens[i]) << "request " << i << ", the MTP layer's drafts";
      EXPECT_EQ(drafted.tokens[i], plain.tokens[i]) << "request " << i << ", oracle drafts";
    }
    EXPECT_GT(own.stats.spec_drafts, 0u);
    EXPECT_GT(drafted.stats.spec_accepted_tokens, drafted.stats.spec_draft_tokens / 2);
  }
}

// The MTP drafting steps on the GPU against the CPU (fp32 matmuls): the first from the forward's hidden rows
// kept on the device, then chained steps, which the GPU measures, records and replays as CUDA graphs (the
// same batch size every time): every draft equal to the CPU's.
TEST(CudaSpeculative, ChainedDraftStepsReplayedAsGraphsDraftWhatTheCpuDrafts) {
  MOESERVE_REQUIRE_GPU();
  ModelWeights weights = load_checkpoint("tests/fixtures/models/tiny-moe-mtp");
  auto cpu = make_cpu_backend();
  auto gpu = make_backend("cuda", {.fp32_matmul = true});
  const std::vector<int32_t> a = {5, 77, 301, 12, 12, 490, 3, 250, 18}, b = {64, 7, 99, 411, 2, 35, 200, 140};
  const std::vector<int32_t> pages_a{0, 1, 2}, pages_b{3, 4, 5};
  std::vector<std::vector<int32_t>> drafts_of;  // per backend: every step's drafts, in order
  for (Backend* be : {cpu.get(), gpu.get()}) {
    Qwen35Model model(weights, *be);
    model.prepare_mtp();
    KvCache kv(model.kv_cache_spec(16, 6)), mtp_kv(model.mtp_kv_cache_spec(16, 6));
    StateCache state(model.state_cache_spec(2));
    SequenceStep target[2] = {{a, 0, pages_a, 0}, {b, 0, pages_b, 1}};
    target[0].hidden = target[1].hidden = true;
    model.forward(target, kv, state);
    std::vector<int32_t> rows_a(a.begin() + 1, a.end()), rows_b(b.begin() + 1, b.end());
    rows_a.push_back(17);
    rows_b.push_back(300);
    SequenceStep steps[2] = {{rows_a, 0, pages_a, 0}, {rows_b, 0, pages_b, 1}};
    std::vector<int64_t> sources(a.size() + b.size());
    for (size_t i = 0; i < sources.size(); ++i) sources[i] = int64_t(i);
    std::vector<int32_t> drafts = model.mtp_draft(steps, sources, true, mtp_kv), all = drafts;
    for (int step = 0; step < 12; ++step) {
      const std::vector<int32_t> these = drafts;
      for (size_t i = 0; i < 2; ++i) {
        steps[i].start_pos += int64_t(steps[i].tokens.size());
        steps[i].tokens = {&these[i], 1};
      }
      const std::vector<int64_t> previous{0, 1};
      drafts = model.mtp_draft(steps, previous, false, mtp_kv);
      all.insert(all.end(), drafts.begin(), drafts.end());
    }
    drafts_of.push_back(all);
  }
  EXPECT_EQ(drafts_of[1], drafts_of[0]);
}

// The first drafting step of each engine step (the MTP layer fed the rows the target's step kept, from its
// hidden rows on the device) on the GPU against the CPU (fp32 matmuls): target steps of 3 new tokens per
// sequence, then the first step over those rows, 11 times at the same shape, so the GPU measures, records and
// replays it as a CUDA graph while positions, pages and hidden rows change: every draft equal to the CPU's.
TEST(CudaSpeculative, FirstDraftStepsReplayedAsGraphsDraftWhatTheCpuDrafts) {
  MOESERVE_REQUIRE_GPU();
  ModelWeights weights = load_checkpoint("tests/fixtures/models/tiny-moe-mtp");
  auto cpu = make_cpu_backend();
  auto gpu = make_backend("cuda", {.fp32_matmul = true});
  std::mt19937 rng(5);
  std::vector<int32_t> a(40), b(40);  // prompt of 4 tokens, then 3 per step
  for (auto* seq : {&a, &b})
    for (auto& t : *seq) t = int32_t(rng() % 512);
  const std::vector<int32_t> pages_a{0, 1, 2}, pages_b{3, 4, 5};
  std::vector<std::vector<int32_t>> drafts_of;  // per backend: every step's drafts, in order
  int64_t replays = 0;
  for (Backend* be : {cpu.get(), gpu.get()}) {
    Qwen35Model model(weights, *be);
    model.prepare_mtp();
    KvCache kv(model.kv_cache_spec(16, 6)), mtp_kv(model.mtp_kv_cache_spec(16, 6));
    StateCache state(model.state_cache_spec(2));
    const int64_t gpu_replays = be == gpu.get() ? cuda_tools::graph_counts(*be).replays : 0;
    std::vector<int32_t> all;
    for (int64_t start = 0; start + 3 < int64_t(a.size()); start += start == 0 ? 4 : 3) {
      const int64_t T = start == 0 ? 4 : 3;
      SequenceStep target[2] = {
          {std::span<const int32_t>(a).subspan(size_t(start), size_t(T)), start, pages_a, 0},
          {std::span<const int32_t>(b).subspan(size_t(start), size_t(T)), start, pages_b, 1}};
      target[0].hidden = target[1].hidden = true;
      model.forward(target, kv, state);
      // Row p: token t_{p+1} at position p, the target's hidden row of p.
      SequenceStep rows[2] = {
          {std::span<const int32_t>(a).subspan(size_t(start + 1), size_t(T)), start, pages_a, 0},
          {std::span<const int32_t>(b).subspan(size_t(start + 1), size_t(T)), start, pages_b, 1}};
      std::vector<int64_t> sources(size_t(2 * T));
      for (size_t i = 0; i < sources.size(); ++i) sources[i] = int64_t(i);
      const std::vector<int32_t> drafts = model.mtp_draft(rows, sources, true, mtp_kv);
      all.insert(all.end(), drafts.begin(), drafts.end());
    }
    if (be == gpu.get()) replays = cuda_tools::graph_counts(*be).replays - gpu_replays;
    drafts_of.push_back(all);
  }
  EXPECT_EQ(drafts_of[1], drafts_of[0]);
  // The first step at position 0 and the first one at the 3-row shape run eagerly, the next is recorded;
  // the 9 after it replay. (The target's steps, a prefill and 3-token chunks, run eagerly.)
  EXPECT_GE(replays, 6);
}

}  // namespace
}  // namespace moeserve
