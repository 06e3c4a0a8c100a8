// Speculative decoding with the MTP layer (engine/speculative.h) on real checkpoints: whatever the drafts,
// the output is exactly what plain decoding gives (greedy token for token, seeded sampling too), batched,
// across prefix-cache hits of a multi-turn conversation and under preemption; the rejection rule keeps the
// target's distribution; max_tokens, stop ids, logprobs and JSON output compose.
#include "engine/speculative.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/json_constraint.h"
#include "engine/model_runner.h"
#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/qwen35.h"
#include "model/sequence.h"
#include "oracle_drafts.h"
#include "requests.h"

namespace moeserve {
namespace {

using engine_test::greedy;
using engine_test::OracleDrafts;
using engine_test::random_prompt;

const std::string kModels = "tests/fixtures/models/";

EngineOptions options(int spec_steps, int page_size = 16, int max_running = 16) {
  EngineOptions o;
  o.page_size = page_size;
  o.cache_memory_bytes = 16 << 20;
  o.max_running_requests = max_running;
  o.chunked_prefill_size = 32;
  o.max_num_batched_tokens = 96;
  o.max_model_len = 512;
  o.speculative_num_steps = spec_steps;
  o.speculative_adaptive = false;  // every decode step drafts: the rollback paths run as often as they can
  return o;
}

struct RunResult {
  std::vector<GenerateOutput> outputs;
  EngineStats stats;
};

// Runs the requests through one EngineCore (checking its invariants after every step), the first half at
// once and the rest joining while the first decode.
RunResult run(std::unique_ptr<ModelRunner> model, const EngineOptions& o,
              const std::vector<std::vector<int32_t>>& prompts, const std::vector<SamplingParams>& params) {
  EngineCore core(std::move(model), o);
  std::vector<std::shared_ptr<OutputStream>> streams;
  auto add = [&](size_t i) {
    GenerateRequest r{
        .id = "r" + std::to_string(i), .prompt = prompts[i], .params = params[i], .priority = int(i % 2)};
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
    SamplingParams p = greedy(uniform(8, 40), 2);
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
  for (std::string name : {"tiny-moe-mtp", "tiny-moe-vl-layout-mtp"})
    models.emplace_back(name, load_checkpoint(kModels + name));
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
      auto oracle = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, nullptr), 5);
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

// A drafting model for `weights` whose oracle knows the plain run's sequences.
std::unique_ptr<OracleDrafts> oracle_for(const ModelWeights& weights, const Workload& w,
                                         const RunResult& plain, int miss_every = 5, int own_every = 0) {
  auto oracle = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, nullptr), miss_every, own_every);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    auto sequence = w.prompts[i];
    sequence.insert(sequence.end(), plain.outputs[i].tokens.begin(), plain.outputs[i].tokens.end());
    oracle->learn(sequence);
  }
  return oracle;
}

// Five turns of a conversation, each the previous prompt + its answer + new text: every turn after the first
// starts from the prefix cache (KV pages and a GDN snapshot filed by a speculative turn) and continues
// exactly. Page size 4 makes hits end inside pages (copy-on-write).
TEST(Speculative, MultiTurnConversationFromThePrefixCacheEqualsPlainDecoding) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> turns_plain;
  // The plain conversation first, then the oracle learns it; the speculative one must follow it turn by turn.
  auto converse = [&](std::unique_ptr<ModelRunner> model, int spec_steps, std::vector<GenerateOutput>* outs) {
    std::mt19937 text(23);
    EngineCore core(std::move(model), options(spec_steps, 4));
    std::vector<int32_t> conversation = random_prompt(text, 30, 512);
    std::vector<std::vector<int32_t>> prompts;
    for (int turn = 0; turn < 5; ++turn) {
      prompts.push_back(conversation);
      auto stream = std::make_shared<OutputStream>();
      GenerateRequest r{.id = "t" + std::to_string(turn), .prompt = conversation, .params = greedy(12, 2)};
      r.on_output = stream->sink();
      core.add(std::move(r));
      while (!core.idle()) {
        core.step();
        core.deliver();
        core.check_invariants();
      }
      GenerateOutput out = stream->collect();
      if (turn > 0) {
        EXPECT_EQ(out.usage.cached_tokens, int64_t(conversation.size()) - 10 - 1) << "turn " << turn;
      }
      outs->push_back(out);
      conversation.insert(conversation.end(), out.tokens.begin(), out.tokens.end());
      auto more = random_prompt(text, 10, 512);
      conversation.insert(conversation.end(), more.begin(), more.end());
    }
    return prompts;
  };
  std::vector<GenerateOutput> plain, mtp, drafted;
  const auto prompts = converse(make_qwen35_runner(weights, nullptr), 0, &plain);
  converse(make_qwen35_runner(weights, nullptr), 3, &mtp);
  auto oracle = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, nullptr), 4);
  for (size_t t = 0; t < prompts.size(); ++t) {
    auto sequence = prompts[t];
    sequence.insert(sequence.end(), plain[t].tokens.begin(), plain[t].tokens.end());
    oracle->learn(sequence);
  }
  converse(std::move(oracle), 3, &drafted);
  RunResult want{plain, {}}, got_mtp{mtp, {}}, got_drafted{drafted, {}};
  expect_same_outputs(got_mtp, want);
  expect_same_outputs(got_drafted, want);
}

// The MTP layer's KV rows of a cached prefix come with it: a turn served from the prefix cache (the pages
// and the snapshot the previous, speculative turn filed; page size 4, so hits end inside a copied-on-write
// page) drafts exactly the tokens, and accepts exactly the drafts, that the same prompt gets in a fresh
// engine without a prefix cache, where the MTP layer computes every row itself. The drafts are the MTP
// layer's own (random weights: all rejected), then an oracle's at odd positions and the MTP layer's at even
// ones, so some are accepted; a stale or missing MTP row of the prefix shows as different drafts either way.
TEST(Speculative, PrefixCacheHitDraftsExactlyAsAColdRun) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  struct Turn {
    GenerateOutput out;
    std::vector<std::vector<int32_t>> verified;
    uint64_t draft_tokens = 0, accepted_tokens = 0;
  };
  auto serve = [](EngineCore& core, const OracleDrafts::Log& log, const std::vector<int32_t>& prompt) {
    const EngineStats before = core.stats();
    log->clear();
    auto stream = std::make_shared<OutputStream>();
    GenerateRequest r{.id = "turn", .prompt = prompt, .params = greedy(12, 2)};
    r.on_output = stream->sink();
    core.add(std::move(r));
    while (!core.idle()) {
      core.step();
      core.deliver();
      core.check_invariants();
    }
    const EngineStats after = core.stats();
    return Turn{stream->collect(), *log, after.spec_draft_tokens - before.spec_draft_tokens,
                after.spec_accepted_tokens - before.spec_accepted_tokens};
  };
  // The conversation, plainly decoded: each turn's prompt is the last one + its answer + new text.
  std::vector<std::vector<int32_t>> prompts;
  {
    EngineCore plain(make_qwen35_runner(weights, nullptr), options(0, 4));
    auto log = std::make_shared<std::vector<std::vector<int32_t>>>();
    std::mt19937 text(41);
    std::vector<int32_t> conversation = random_prompt(text, 30, 512);
    for (int turn = 0; turn < 5; ++turn) {
      prompts.push_back(conversation);
      const Turn t = serve(plain, log, conversation);
      conversation.insert(conversation.end(), t.out.tokens.begin(), t.out.tokens.end());
      auto more = random_prompt(text, 10, 512);
      conversation.insert(conversation.end(), more.begin(), more.end());
    }
    prompts.push_back(conversation);  // the last turn's answer included: what the oracle learns
  }
  for (bool oracle : {false, true}) {
    SCOPED_TRACE(oracle ? "oracle and MTP drafts" : "MTP drafts");
    auto model = [&] {
      auto m = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, nullptr), 5, 2);
      if (oracle) m->learn(prompts.back());
      return m;
    };
    auto warm_model = model();
    const OracleDrafts::Log warm_log = warm_model->verified();
    EngineCore warm(std::move(warm_model), options(3, 4));
    uint64_t accepted = 0;
    for (size_t turn = 0; turn + 1 < prompts.size(); ++turn) {
      SCOPED_TRACE("turn " + std::to_string(turn));
      const Turn hit = serve(warm, warm_log, prompts[turn]);
      EngineOptions cold_options = options(3, 4);
      cold_options.enable_prefix_cache = false;
      auto cold_model = model();
      const OracleDrafts::Log cold_log = cold_model->verified();
      EngineCore cold_core(std::move(cold_model), cold_options);
      const Turn cold = serve(cold_core, cold_log, prompts[turn]);
      if (turn > 0) {
        EXPECT_EQ(hit.out.usage.cached_tokens, int64_t(prompts[turn].size()) - 10 - 1);
      }
      EXPECT_EQ(cold.out.usage.cached_tokens, 0);
      ASSERT_EQ(hit.out.tokens, cold.out.tokens);
      EXPECT_EQ(hit.verified, cold.verified);
      EXPECT_FALSE(cold.verified.empty());
      EXPECT_EQ(hit.draft_tokens, cold.draft_tokens);
      EXPECT_EQ(hit.accepted_tokens, cold.accepted_tokens);
      accepted += hit.accepted_tokens;
    }
    if (oracle) {
      EXPECT_GT(accepted, 0u);
    }
  }
}

// Preempted requests resume from their snapshots (the MTP rows filed with them) and draft exactly what they
// draft on a roomy pool without a prefix cache. Drafts as in PrefixCacheHitDraftsExactlyAsAColdRun (the MTP
// layer's at even positions, an oracle's at odd ones).
TEST(Speculative, PreemptedRequestsDraftAsOnARoomyPool) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  Workload w = workload(512, 12, 43, false);
  for (auto& p : w.params) p.max_tokens = std::min(*p.max_tokens, 30);
  // No shared prefix: a hit is a preempted request's own (a branch's hit is inexact, docs/engine.md).
  for (size_t i = 1; i < w.prompts.size(); i += 3)
    w.prompts[i].erase(w.prompts[i].begin(), w.prompts[i].begin() + 40);
  for (auto& p : w.prompts) p.resize(std::min<size_t>(p.size(), 60));
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), options(0, 4), w.prompts, w.params);

  EngineOptions roomy = options(3, 4);
  roomy.enable_prefix_cache = false;
  auto roomy_model = oracle_for(weights, w, plain, 5, 2);
  const OracleDrafts::Log roomy_log = roomy_model->verified();
  const RunResult want = run(std::move(roomy_model), roomy, w.prompts, w.params);

  auto probe = make_qwen35_runner(weights, nullptr);
  EngineOptions small = options(3, 4);
  small.max_running_requests = 8;
  small.snapshot_slots = 4;
  small.max_model_len = 100;
  KvCacheSpec kv = probe->kv_cache_spec(4, 1);
  ++kv.num_layers;  // the MTP layer's rows
  small.cache_memory_bytes =
      (8 * 4 + 4) * probe->state_cache_spec(1).bytes_per_slot() + 40 * 4 * kv.bytes_per_token();
  auto small_model = oracle_for(weights, w, plain, 5, 2);
  const OracleDrafts::Log small_log = small_model->verified();
  const RunResult got = run(std::move(small_model), small, w.prompts, w.params);

  expect_same_outputs(got, plain);
  expect_same_outputs(want, plain);
  EXPECT_GT(got.stats.preemptions, 0u);
  EXPECT_EQ(want.stats.preemptions, 0u);
  // Batches differ between the pools, and the small one drafts less (no pages for a verify step: no drafts),
  // so the verify steps differ; but a verify step at a position drafts the same tokens in both. Keyed by
  // position and pending token (steps at keys seen more than once in the roomy run are skipped).
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> roomy_drafts;
  std::map<std::pair<int32_t, int32_t>, int> seen;
  for (const auto& step : *roomy_log) {
    roomy_drafts[{step[0], step[1]}] = step;
    ++seen[{step[0], step[1]}];
  }
  int compared = 0;
  for (const auto& step : *small_log) {
    const std::pair<int32_t, int32_t> key{step[0], step[1]};
    if (seen[key] != 1) continue;
    const std::vector<int32_t>& want_step = roomy_drafts[key];
    const size_t n = std::min(step.size(), want_step.size());  // the small pool may draft fewer
    EXPECT_EQ(std::vector<int32_t>(step.begin(), step.begin() + n),
              std::vector<int32_t>(want_step.begin(), want_step.begin() + n));
    ++compared;
  }
  EXPECT_GT(compared, 50);
  EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
}

// Preemption with drafts in flight: 16 requests on a KV pool of 160 tokens are preempted and resume (from
// their snapshots or recomputing), yet get exactly the tokens of plain decoding on a roomy pool, and every
// page and slot is back at the end.
TEST(Speculative, PreemptionOnASmallPoolChangesNoToken) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  const Workload w = workload(512, 16, 25, true);
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), options(0, 4), w.prompts, w.params);

  auto probe = make_qwen35_runner(weights, nullptr);
  EngineOptions small = options(3, 4);
  small.max_running_requests = 8;
  small.snapshot_slots = 4;
  small.max_model_len = 100;
  // 12 state slots (8 live with 3 trail slots each would be 32: the budget holds them) and 40 pages of 4 with
  // the MTP layer's rows.
  KvCacheSpec kv = probe->kv_cache_spec(4, 1);
  ++kv.num_layers;
  small.cache_memory_bytes =
      (8 * 4 + 4) * probe->state_cache_spec(1).bytes_per_slot() + 40 * 4 * kv.bytes_per_token();
  {
    EngineCore sized(make_qwen35_runner(weights, nullptr), small);
    ASSERT_EQ(sized.capacity().kv_tokens, 160);
    ASSERT_EQ(sized.capacity().snapshot_slots, 4);
  }
  std::vector<SamplingParams> params = w.params;
  for (auto& p : params) p.max_tokens = std::min(*p.max_tokens, 30);
  std::vector<std::vector<int32_t>> prompts = w.prompts;
  for (auto& p : prompts) p.resize(std::min<size_t>(p.size(), 60));
  const RunResult roomy = run(make_qwen35_runner(weights, nullptr), options(0, 4), prompts, params);
  for (int miss : {3, 1000}) {
    SCOPED_TRACE(miss);
    Workload learned{prompts, params};
    const RunResult got = run(oracle_for(weights, learned, roomy, miss), small, prompts, params);
    expect_same_outputs(got, roomy);
    EXPECT_GT(got.stats.preemptions, 0u);
    EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
    EXPECT_EQ(got.stats.live_slots_used, 0);
    EXPECT_EQ(got.stats.kv_pages_used, 0);
  }
  (void)plain;
}

// Stop ids, eos with min_tokens, max_tokens of 1 and 2, and logprobs: a request ends where plain decoding
// ends it, even when the stop token or the limit falls inside a run of accepted drafts.
TEST(Speculative, StopTokensMaxTokensAndLogprobsCompose) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  Workload w = workload(512, 12, 27, false);
  const RunResult free_run = run(make_qwen35_runner(weights, nullptr), options(0), w.prompts, w.params);
  for (size_t i = 0; i < w.params.size(); ++i) {
    SamplingParams& p = w.params[i];
    const auto& tokens = free_run.outputs[i].tokens;
    if (i % 4 == 0) p.stop_token_ids = {tokens[tokens.size() / 2]};  // stop mid-way
    if (i % 4 == 1) p.max_tokens = 1 + int(i % 2);
    if (i % 4 == 2) {  // the model's eos is the token it emits a few steps in, banned before min_tokens
      p.ignore_eos = false;
      p.min_tokens = 2;
    }
    p.top_logprobs = 4;
  }
  EngineOptions plain_options = options(0), spec_options = options(3);
  plain_options.eos_token_ids = spec_options.eos_token_ids =
      std::vector<int32_t>{free_run.outputs[2].tokens[3]};
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), plain_options, w.prompts, w.params);
  const RunResult got = run(oracle_for(weights, w, free_run, 7), spec_options, w.prompts, w.params);
  expect_same_outputs(got, plain);
  EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
  for (size_t i = 0; i < w.params.size(); ++i) {
    if (i % 4 == 0) {
      EXPECT_EQ(got.outputs[i].finish_reason, FinishReason::Stop) << i;
    } else if (i % 4 == 1) {
      EXPECT_EQ(int(got.outputs[i].tokens.size()), *w.params[i].max_tokens) << i;
    }
  }
}

// Verify rows reduced to logit candidates where the model runs (what a GPU does by default): every row of a
// verify step is sampled from its candidates when they decide the token and from the fetched full row when
// they do not (penalties, a top-k beyond them), so greedy and seeded sampling, logprobs included, give the
// tokens full rows give.
TEST(Speculative, VerifyRowsReducedToCandidatesChangeNoToken) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  for (bool sampling : {false, true}) {
    SCOPED_TRACE(sampling ? "greedy and sampled" : "greedy");
    Workload w = workload(int(weights.config.vocab_size), 12, 41, sampling);
    for (size_t i = 0; i < w.params.size(); ++i)
      if (i % 3 == 0) w.params[i].top_logprobs = 3;
    EngineOptions full = options(0);
    full.logit_candidates = 0;
    const RunResult plain = run(make_qwen35_runner(weights, nullptr), full, w.prompts, w.params);
    for (int k : {1, 16}) {
      SCOPED_TRACE("candidates = " + std::to_string(k));
      EngineOptions o = options(3);
      o.logit_candidates = k;
      const RunResult got = run(oracle_for(weights, w, plain, 4), o, w.prompts, w.params);
      expect_same_outputs(got, plain);
      EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
      if (sampling)
        EXPECT_GT(got.stats.sampled_from_full_rows, 0u) << "penalties need full rows";
      else
        EXPECT_EQ(got.stats.sampled_from_full_rows, 0u) << "greedy rows need only their candidates";
    }
  }
}

// bf16 state slots (--mamba-ssm-cache-dtype bfloat16): plain decoding rounds a slot after every token, and
// so must a verify step, after every position it keeps, or the continuation after a rollback drifts.
TEST(Speculative, Bf16StateSlotsRoundAfterEveryVerifiedToken) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  Workload w = workload(int(weights.config.vocab_size), 10, 43, false);
  EngineOptions plain_options = options(0), spec_options = options(3);
  plain_options.state_dtype = spec_options.state_dtype = StateDtype::BF16;
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), plain_options, w.prompts, w.params);
  const RunResult got = run(oracle_for(weights, w, plain, 4), spec_options, w.prompts, w.params);
  expect_same_outputs(got, plain);
  EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
}

// Structured output: the grammar advances only over accepted tokens, so every answer is the one plain
// decoding gives under the same JSON constraint, and a valid JSON prefix.
TEST(Speculative, JsonConstrainedOutputEqualsPlainDecoding) {
  ModelWeights weights = demo_weights();
  const int vocab = int(weights.config.vocab_size);
  auto table = std::make_shared<TokenBytes>();
  const std::string chars = "{}[],:\" \n0123456789-.eatrufsnlxyz";
  for (int32_t id = 0; id < vocab; ++id) {
    // Single characters first, then two-character pieces.
    table->bytes.push_back(size_t(id) < chars.size() ? std::string(1, chars[size_t(id)])
                                                     : std::string{chars[size_t(id) % chars.size()],
                                                                   chars[size_t(id / 7) % chars.size()]});
    table->usable.push_back(id < vocab - 8);
  }
  auto constraint = std::make_shared<JsonConstraint>();
  constraint->schema = JsonSchema::any_object();
  constraint->vocab = table;
  Workload w = workload(vocab, 8, 29, true);
  for (auto& p : w.params) {
    p.json = constraint;
    p.ignore_eos = false;
  }
  EngineOptions plain_options = options(0), spec_options = options(2);
  plain_options.eos_token_ids = spec_options.eos_token_ids = std::vector<int32_t>{vocab - 1};
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), plain_options, w.prompts, w.params);
  const RunResult got = run(oracle_for(weights, w, plain, 3), spec_options, w.prompts, w.params);
  expect_same_outputs(got, plain);
  EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
  for (const auto& out : got.outputs) {
    JsonMatcher m(constraint->schema);
    for (int32_t t : out.tokens) {
      if (t == vocab - 1) break;  // eos
      EXPECT_TRUE(m.advance(table->bytes[size_t(t)])) << t;
    }
  }
}

// The rejection rule keeps the target's distribution: 1,200 seeded requests sample three tokens at
// temperature 1 over the top 6 with oracle drafts (the greedy continuation, accepted about as often as the
// target picks it). Among those whose first token is the greedy one, the second token's counts fit the
// model's own probabilities: chi-square with 5 degrees of freedom under 30 (p < 1e-4 for a true fit).
// Deterministic seeds.
TEST(Speculative, SampledTokensFollowTheTargetDistribution) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  const std::vector<int32_t> prompt = {11, 300, 42, 7, 199, 5, 480, 61};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 6;
  p.max_tokens = 3;  // the second token comes from a verify step (no drafts when one token is left)
  p.ignore_eos = true;
  SamplingParams g = greedy(3, 0);
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), options(0), {prompt}, {g});
  const int32_t first = plain.outputs[0].tokens[0];

  const int n = 1200;
  std::vector<std::vector<int32_t>> prompts(n, prompt);
  std::vector<SamplingParams> params(n, p);
  for (int i = 0; i < n; ++i) params[size_t(i)].seed = uint64_t(1000 + i);
  auto oracle = std::make_unique<OracleDrafts>(make_qwen35_runner(weights, nullptr), 1 << 30);
  auto sequence = prompt;
  sequence.insert(sequence.end(), plain.outputs[0].tokens.begin(), plain.outputs[0].tokens.end());
  oracle->learn(sequence);
  EngineOptions o = options(1);
  o.enable_prefix_cache = false;
  const RunResult got = run(std::move(oracle), o, prompts, params);
  EXPECT_GT(got.stats.spec_accepted_tokens, 0u);
  EXPECT_LT(got.stats.spec_accepted_tokens, got.stats.spec_draft_tokens);

  // The target's distribution of the second token after (prompt, first): top 6 of its logits, softmax.
  auto backend = make_cpu_backend();
  Qwen35Model model(weights, *backend);
  SequenceRunner runner(model, 16);
  auto ctx = prompt;
  ctx.push_back(first);
  auto logits = runner.prefill(ctx).logits;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 6, order.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  std::map<int32_t, double> prob;
  double z = 0;
  for (int i = 0; i < 6; ++i)
    z += std::exp(double(logits[size_t(order[size_t(i)])] - logits[size_t(order[0])]));
  for (int i = 0; i < 6; ++i)
    prob[order[size_t(i)]] =
        std::exp(double(logits[size_t(order[size_t(i)])] - logits[size_t(order[0])])) / z;

  std::map<int32_t, int> counts;
  int total = 0;
  for (const auto& out : got.outputs) {
    ASSERT_EQ(out.tokens.size(), 3u);
    if (out.tokens[0] != first) continue;
    ++counts[out.tokens[1]];
    ++total;
  }
  ASSERT_GT(total, 150);
  double chi2 = 0;
  for (const auto& [token, q] : prob) {
    const double expected = q * total;
    chi2 += (counts[token] - expected) * (counts[token] - expected) / expected;
    counts.erase(token);
  }
  EXPECT_TRUE(counts.empty()) << "a token outside the top 6 was sampled";
  EXPECT_LT(chi2, 30.0) << total << " samples";
}

// Adaptive drafting: drafts that keep failing (the fixture's random MTP layer) pause; drafts that are mostly
// right (the oracle) keep running. Same tokens either way.
TEST(Speculative, AdaptiveModePausesFailingDraftsOnly) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe-mtp");
  Workload w = workload(512, 6, 33, false);
  for (auto& p : w.params) p.max_tokens = 60;
  const RunResult plain = run(make_qwen35_runner(weights, nullptr), options(0), w.prompts, w.params);
  EngineOptions adaptive = options(3);
  adaptive.speculative_adaptive = true;
  const RunResult failing = run(make_qwen35_runner(weights, nullptr), adaptive, w.prompts, w.params);
  const RunResult good = run(oracle_for(weights, w, plain, 1000), adaptive, w.prompts, w.params);
  expect_same_outputs(failing, plain);
  expect_same_outputs(good, plain);
  const uint64_t generated = 6 * 60;
  EXPECT_LT(failing.stats.spec_drafts * 5, generated) << failing.stats.spec_drafts << " verify steps";
  EXPECT_GT(good.stats.spec_accepted_tokens * 2, generated);
}

// SGLang's and vLLM's spellings resolve to the number of drafts; what is not supported says so by flag name.
TEST(SpeculativeFlags, PeerSpellingsResolveAndTheRestAreRefused) {
  auto steps = [](SpeculativeFlags f) { return speculative_steps(f); };
  auto error = [](SpeculativeFlags f) {
    try {
      speculative_steps(f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(steps({}), 0);
  EXPECT_EQ(steps({.algorithm = "NEXTN"}), 3);
  EXPECT_EQ(steps({.algorithm = "mtp", .num_steps = 2}), 2);
  EXPECT_EQ(steps({.algorithm = "NEXTN", .num_steps = 3, .eagle_topk = 1, .num_draft_tokens = 4}), 3);
  EXPECT_EQ(steps({.algorithm = "MTP", .num_draft_tokens = 5}), 4);
  EXPECT_EQ(steps({.config_json = R"({"method":"mtp","num_speculative_tokens":2})"}), 2);
  EXPECT_EQ(steps({.config_json = R"({"method":"qwen3_next_mtp","num_speculative_tokens":1})"}), 1);
  EXPECT_THAT(error({.algorithm = "EAGLE3"}), ::testing::HasSubstr("only MTP (NEXTN)"));
  EXPECT_THAT(error({.algorithm = "NEXTN", .eagle_topk = 4}),
              ::testing::HasSubstr("--speculative-eagle-topk 4"));
  EXPECT_THAT(error({.algorithm = "NEXTN", .num_steps = 3, .num_draft_tokens = 8}),
              ::testing::HasSubstr("--speculative-num-draft-tokens 8"));
  EXPECT_THAT(error({.algorithm = "NEXTN", .num_steps = 0}), ::testing::HasSubstr("--speculative-num-steps"));
  EXPECT_THAT(error({.algorithm = "NEXTN", .num_steps = 99}), ::testing::HasSubstr("[1, 8]"));
  EXPECT_THAT(error({.num_steps = 3}), ::testing::HasSubstr("need --speculative-algorithm"));
  EXPECT_THAT(error({.config_json = R"({"method":"eagle","num_speculative_tokens":2})"}),
              ::testing::HasSubstr("method 'eagle'"));
  EXPECT_THAT(error({.config_json = R"({"method":"mtp","model":"x","num_speculative_tokens":2})"}),
              ::testing::HasSubstr("'model' is not supported"));
  EXPECT_THAT(error({.config_json = R"({"method":"mtp"})"}), ::testing::HasSubstr("num_speculative_tokens"));
  EXPECT_THAT(error({.config_json = "{nope"}), ::testing::HasSubstr("not valid JSON"));
  EXPECT_THAT(error({.algorithm = "MTP", .config_json = "{}"}), ::testing::HasSubstr("not both"));
}

// The engine refuses speculative decoding on a model without an MTP layer, at creation, with the reason.
TEST(SpeculativeFlags, AModelWithoutMtpIsRefusedAtCreation) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe");
  try {
    EngineCore core(make_qwen35_runner(weights, nullptr), options(3));
    ADD_FAILURE() << "created";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("needs the checkpoint's MTP layer"));
  }
}

}  // namespace
}  // namespace moeserve
