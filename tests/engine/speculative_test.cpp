// Speculative decoding with the MTP layer (engine/speculative.h) on real checkpoints: whatever the drafts, the
// output is exactly what plain decoding gives (greedy token for token, seeded sampling too), batched, across
// prefix-cache hits of a multi-turn conversation and under preemption; the rejection rule keeps the target's
// distribution; max_tokens, stop ids, logprobs and JSON output compose.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/json_constraint.h"
#include "engine/model_runner.h"
#include "model/checkpoint.h"
#include "model/init_model.h"

namespace moeserve {
namespace {

const std::string kModels = "tests/fixtures/models/";

EngineOptions options(int spec_steps, int page_size = 16, int max_running = 16) {
  EngineOptions o;
  o.page_size = page_size;
  o.cache_memory_bytes = 16 << 20;
  o.max_running_requests = max_running;
  o.chunked_prefill_size = 32;
  o.max_prefill_tokens = 96;
  o.max_model_len = 512;
  o.speculative_num_steps = spec_steps;
  o.speculative_adaptive = false;  // every decode step drafts: the rollback paths run as often as they can
  return o;
}

SamplingParams greedy(int max_tokens, int top_logprobs = 2) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = top_logprobs > 0;
  p.top_logprobs = top_logprobs;
  return p;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
  return t;
}

// The real runner, with the MTP layer's drafts replaced by an oracle's where it knows the continuation: the
// token that followed (position, token) in the sequences it was shown, unless the position is a multiple of
// `miss_every` (then the token after it, a wrong draft). The random-weight MTP layers of the fixtures are
// almost always wrong; the oracle makes drafts accepted at every length, so each rollback depth is taken.
class OracleDrafts : public ModelRunner {
 public:
  OracleDrafts(const ModelWeights& weights, int miss_every) : inner_(make_qwen35_runner(weights, nullptr)), miss_(miss_every) {}
  void learn(const std::vector<int32_t>& sequence) {
    for (size_t i = 0; i + 1 < sequence.size(); ++i) next_[{int64_t(i), sequence[i]}] = sequence[i + 1];
  }

  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_position_embeddings() const override { return inner_->max_position_embeddings(); }
  std::vector<int32_t> eos_token_ids() const override { return inner_->eos_token_ids(); }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return inner_->kv_cache_spec(page_size, num_pages);
  }
  StateCacheSpec state_cache_spec(int num_slots) const override { return inner_->state_cache_spec(num_slots); }
  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    return inner_->forward(batch, kv, state);
  }
  bool has_mtp() const override { return true; }
  int64_t hidden_size() const override { return inner_->hidden_size(); }
  void prepare_mtp() override { inner_->prepare_mtp(); }
  KvCacheSpec mtp_kv_cache_spec(int page_size, int64_t num_pages) const override {
    return inner_->mtp_kv_cache_spec(page_size, num_pages);
  }
  ForwardOutput mtp_forward(std::span<const SequenceStep> batch, std::span<const float> hidden,
                            KvCache& kv) override {
    ForwardOutput out = inner_->mtp_forward(batch, hidden, kv);
    const int64_t V = vocab_size();
    for (size_t i = 0; i < batch.size(); ++i) {
      // The step's last row: token t_{p+1} at position p drafts t_{p+2}.
      const int64_t position = batch[i].start_pos + int64_t(batch[i].tokens.size());
      auto it = next_.find({position, batch[i].tokens.back()});
      if (it == next_.end()) continue;
      const int32_t draft = position % miss_ == 0 ? (it->second + 1) % int32_t(V) : it->second;
      float* row = out.logits.data() + int64_t(i) * V;
      std::fill(row, row + V, 0.0f);
      row[draft] = 1.0f;
    }
    return out;
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
  int miss_;
  std::map<std::pair<int64_t, int32_t>, int32_t> next_;
};

struct RunResult {
  std::vector<GenerateOutput> outputs;
  EngineStats stats;
};

// Runs the requests through one EngineCore (checking its invariants after every step), the first half at
// once and the rest joining while the first decode.
RunResult run(std::unique_ptr<ModelRunner> model, const EngineOptions& o, const std::vector<std::vector<int32_t>>& prompts,
        const std::vector<SamplingParams>& params) {
  EngineCore core(std::move(model), o);
  std::vector<std::shared_ptr<OutputStream>> streams;
  auto add = [&](size_t i) {
    GenerateRequest r{"r" + std::to_string(i), prompts[i], params[i], int(i % 2), {}};
    streams.push_back(std::make_shared<OutputStream>());
    r.on_output = streams.back()->sink();
    core.validate(r);
    core.add(std::move(r));
  };
  const size_t n = prompts.size();
  for (size_t i = 0; i < (n + 1) / 2; ++i) add(i);
  for (int step = 0; step < 20000 && (!core.idle() || streams.size() < n); ++step) {
    if (step >= 4 && step % 3 == 0 && streams.size() < n) add(streams.size());
    core.step();
    core.deliver();
    core.check_invariants();
  }
  EXPECT_TRUE(core.idle());
  RunResult result;
  for (auto& s : streams) result.outputs.push_back(s->collect());
  result.stats = core.stats();
  return result;
}

void expect_same_outputs(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (size_t i = 0; i < got.outputs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const auto &a = got.outputs[i], &b = want.outputs[i];
    ASSERT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      ASSERT_EQ(a.logprobs[t].top.size(), b.logprobs[t].top.size());
      for (size_t k = 0; k < a.logprobs[t].top.size(); ++k) {
        EXPECT_EQ(a.logprobs[t].top[k].token, b.logprobs[t].top[k].token) << "token " << t;
        EXPECT_NEAR(a.logprobs[t].top[k].logprob, b.logprobs[t].top[k].logprob, 2e-4) << "token " << t;
      }
    }
  }
}

// Random prompts, some sharing a prefix (prefix-cache hits), greedy and seeded sampling with penalties.
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
};

Workload workload(int vocab, int n, uint32_t seed, bool sampling) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto shared = random_prompt(rng, 40, vocab);
  Workload w;
  for (int i = 0; i < n; ++i) {
    auto prompt = random_prompt(rng, uniform(1, 60), vocab);
    if (i % 3 == 1) prompt.insert(prompt.begin(), shared.begin(), shared.end());
    w.prompts.push_back(prompt);
    SamplingParams p = greedy(uniform(8, 40));
    if (sampling && i % 2) {
      p.temperature = 0.8f;
      p.top_k = 40;
      p.repetition_penalty = 1.1f;
      p.seed = uint64_t(i);
    }
    w.params.push_back(p);
  }
  return w;
}

ModelWeights demo_weights() {
  ModelConfig config = preset_config("tiny");
  config.mtp_num_layers = 1;
  return make_dummy_weights(config, 7);
}

TEST(Speculative, OutputEqualsPlainDecodingOnEveryMtpModel) {
  std::vector<std::pair<std::string, ModelWeights>> models;
  for (std::string name : {"tiny-moe-mtp", "tiny-moe-vl-layout-mtp"}) models.emplace_back(name, load_checkpoint(kModels + name));
  models.emplace_back("demo", demo_weights());
  for (auto& [name, weights] : models) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(weights.mtp.has_value());
    const Workload w = workload(int(weights.config.vocab_size), 12, 31, true);
    const RunResult plain = run(make_qwen35_runner(weights, nullptr), options(0), w.prompts, w.params);
    for (int k : {1, 3}) {
      SCOPED_TRACE("k = " + std::to_string(k));
      // The model's own MTP layer (random weights: nearly every draft rejected) ...
      const RunResult mtp = run(make_qwen35_runner(weights, nullptr), options(k), w.prompts, w.params);
      expect_same_outputs(mtp, plain);
      EXPECT_GT(mtp.stats.spec_drafts, 0u);
      // ... and oracle drafts, accepted at every depth.
      auto oracle = std::make_unique<OracleDrafts>(weights, 5);
      for (size_t i = 0; i < w.prompts.size(); ++i) {
        auto sequence = w.prompts[i];
        sequence.insert(sequence.end(), plain.outputs[i].tokens.begin(), plain.outputs[i].tokens.end());
        oracle->learn(sequence);
      }
      const RunResult drafted = run(std::move(oracle), options(k), w.prompts, w.params);
      expect_same_outputs(drafted, plain);
      EXPECT_GT(drafted.stats.spec_accepted_tokens, drafted.stats.spec_draft_tokens / 2);
      EXPECT_LT(drafted.stats.steps, plain.stats.steps);
      ASSERT_EQ(drafted.stats.spec_accepted_per_pos.size(), size_t(k));
      EXPECT_GT(drafted.stats.spec_accepted_per_pos.back(), 0u);
    }
  }
}

}  // namespace
}  // namespace moeserve
