// The engine on real checkpoints (tests/fixtures/models): its tokens must be the reference generations, and
// batching or the prefix cache must not change a single one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "common/error.h"
#include "engine/capacity.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/json_constraint.h"
#include "engine/model_runner.h"
#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/safetensors.h"
#include "requests.h"

namespace moeserve {
namespace {

using engine_test::concat;
using engine_test::greedy;
using engine_test::random_prompt;

const std::string kModels = "tests/fixtures/models/";

std::vector<int32_t> int_tensor(const TensorSet& set, const std::string& name) {
  const TensorInfo* t = set.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<int32_t> out(static_cast<size_t>(t->numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = t->dtype == DType::I64 ? int32_t(reinterpret_cast<const int64_t*>(t->data)[i])
                                    : reinterpret_cast<const int32_t*>(t->data)[i];
  return out;
}

constexpr DType kKvDtypes[] = {DType::F32, DType::BF16, DType::F8_E4M3};

EngineOptions options(int page_size = 16, bool prefix_cache = true, int max_running = 16,
                      DType kv = DType::F32) {
  EngineOptions o;
  o.kv_cache_dtype = kv;
  o.page_size = page_size;
  o.cache_memory_bytes = 16 << 20;
  o.max_running_requests = max_running;
  o.chunked_prefill_size = 32;
  o.max_num_batched_tokens = 96;
  o.max_model_len = 512;
  o.enable_prefix_cache = prefix_cache;
  return o;
}

std::shared_ptr<OutputStream> submit(Engine& e, const std::string& id, std::vector<int32_t> prompt,
                                     SamplingParams p) {
  auto stream = std::make_shared<OutputStream>();
  GenerateRequest r{.id = id, .prompt = std::move(prompt), .params = std::move(p)};
  r.on_output = stream->sink();
  e.submit(std::move(r));
  return stream;
}

GenerateOutput generate(Engine& e, const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
  return submit(e, id, std::move(prompt), std::move(p))->collect();
}

// Same tokens, and the same logprobs of each step's top alternatives up to float noise.
void expect_same_generation(const GenerateOutput& got, const GenerateOutput& want, double tolerance = 2e-4) {
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    ASSERT_EQ(got.logprobs[i].top.size(), want.logprobs[i].top.size());
    for (size_t k = 0; k < got.logprobs[i].top.size(); ++k) {
      EXPECT_EQ(got.logprobs[i].top[k].token, want.logprobs[i].top[k].token) << "step " << i;
      EXPECT_NEAR(got.logprobs[i].top[k].logprob, want.logprobs[i].top[k].logprob, tolerance) << "step " << i;
    }
  }
}

TEST(EngineOnModel, GreedyTokensAreTheReferenceGenerationsEvenWhenBatched) {
  for (std::string model : {"tiny-moe", "tiny-dense", "small-moe-realdims"}) {
    SCOPED_TRACE(model);
    ModelWeights weights = load_checkpoint(kModels + model);
    TensorSet ref = TensorSet::open_file(kModels + model + "/reference.safetensors");
    auto engine = Engine::create(weights, options());
    std::vector<std::pair<std::vector<int32_t>, std::shared_ptr<OutputStream>>> runs;
    for (int g = 0; ref.find("gen" + std::to_string(g) + ".input_ids"); ++g) {
      std::string key = "gen" + std::to_string(g);
      auto want = int_tensor(ref, key + ".output_ids");
      runs.emplace_back(want,
                        submit(*engine, key, int_tensor(ref, key + ".input_ids"), greedy(int(want.size()))));
    }
    ASSERT_FALSE(runs.empty());
    for (auto& [want, stream] : runs) EXPECT_EQ(stream->collect().tokens, want);
  }
}

// For every KV cache dtype: a sequence's pages hold the same rounded K/V whatever else shares the step.
TEST(EngineOnModel, SixteenBatchedRequestsEqualEachAlone) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe");
  std::mt19937 rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i)
    prompts.push_back(random_prompt(rng, std::uniform_int_distribution<int>(1, 70)(rng), 512));

  for (DType kv : kKvDtypes) {
    SCOPED_TRACE(std::string(dtype_name(kv)));
    auto batched = Engine::create(weights, options(16, true, 16, kv));
    EXPECT_EQ(batched->capacity().kv_dtype, kv);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 16; ++i)
      streams.push_back(submit(*batched, "b" + std::to_string(i), prompts[size_t(i)], greedy(10, 3)));

    auto alone = Engine::create(weights, options(16, /*prefix_cache=*/false, /*max_running=*/1, kv));
    for (int i = 0; i < 16; ++i) {
      SCOPED_TRACE(i);
      expect_same_generation(streams[size_t(i)]->collect(),
                             generate(*alone, "a" + std::to_string(i), prompts[size_t(i)], greedy(10, 3)));
    }
  }
}

// A demo model as `moeserve init-model` makes it, with the Qwen3 vocabulary: greedy and seeded sampling
// requests (penalties, top-p, top-k over 151936 tokens) get the same tokens batched as alone.
TEST(EngineOnModel, DemoModelWithQwenVocabularyBatchedEqualsAlone) {
  ModelConfig config = preset_config("tiny");
  config.vocab_size = 151936;
  config.eos_token_ids = {151645, 151643};
  ModelWeights weights = make_dummy_weights(config, 7);
  std::mt19937 rng(24);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(
        random_prompt(rng, std::uniform_int_distribution<int>(1, 50)(rng), int(config.vocab_size)));
    SamplingParams p = greedy(8, 2);
    if (i % 2) {
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.top_k = i % 4 == 1 ? 50 : 0;
      p.repetition_penalty = 1.1f;
      p.presence_penalty = 0.5f;
      p.seed = uint64_t(i);
    }
    params.push_back(p);
  }
  auto batched = Engine::create(weights, options());
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 16; ++i)
    streams.push_back(submit(*batched, "b" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]));
  auto alone = Engine::create(weights, options(16, false, 1));
  for (int i = 0; i < 16; ++i) {
    SCOPED_TRACE(i);
    expect_same_generation(streams[size_t(i)]->collect(),
                           generate(*alone, "a" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]));
  }
}

// Sampling from candidates reduced where the logits are (forced on the CPU here; the default on a GPU) gives
// every request exactly the tokens and logprobs that full rows give: greedy, seeded top-k/top-p/min-p, pure
// temperature, penalties, eos banned before min_tokens, top_k wider than the candidates.
TEST(EngineOnModel, LogitCandidatesGiveTheFullRowTokens) {
  ModelConfig config = preset_config("tiny");
  config.vocab_size = 151936;
  config.eos_token_ids = {151645, 151643};
  ModelWeights weights = make_dummy_weights(config, 9);
  std::mt19937 rng(31);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(
        random_prompt(rng, std::uniform_int_distribution<int>(1, 40)(rng), int(config.vocab_size)));
    SamplingParams p = greedy(6, i % 3 == 0 ? 4 : 0);
    p.seed = uint64_t(100 + i);
    switch (i % 8) {
      case 1:
        p.temperature = 0.7f, p.top_k = 20;
        break;
      case 2:
        p.temperature = 0.3f, p.top_p = 0.8f;
        break;
      case 3:
        p.temperature = 0.5f, p.min_p = 0.2f;
        break;
      case 4:
        p.temperature = 0.2f;
        break;  // the whole vocabulary
      case 5:
        p.temperature = 0.9f, p.top_k = 400;
        break;  // wider than the candidates
      case 6:
        p.temperature = 0.8f, p.repetition_penalty = 1.3f;
        break;
      case 7:
        p.ignore_eos = false, p.min_tokens = 4, p.temperature = i < 8 ? 0.4f : 0.0f;
        break;
      default:
        break;
    }
    params.push_back(p);
  }
  std::vector<GenerateOutput> want;
  {
    EngineOptions o = options();
    o.logit_candidates = 0;
    auto engine = Engine::create(weights, o);
    for (int i = 0; i < 16; ++i)
      want.push_back(generate(*engine, "f" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]));
  }
  for (int k : {16, 256}) {
    SCOPED_TRACE(k);
    EngineOptions o = options();
    o.logit_candidates = k;
    auto engine = Engine::create(weights, o);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 16; ++i)
      streams.push_back(submit(*engine, "c" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]));
    for (int i = 0; i < 16; ++i) {
      SCOPED_TRACE(i);
      expect_same_generation(streams[size_t(i)]->collect(), want[size_t(i)]);
    }
    const EngineStats stats = engine->stats();
    EXPECT_GT(stats.sampled_from_full_rows, 0u) << "penalties need full rows";
    EXPECT_LT(stats.sampled_from_full_rows + 12, stats.generation_tokens) << "greedy needs only candidates";
  }
}

// Under a JSON constraint too (where the candidates rarely hold a valid token and the rejections draw more
// than once), candidates give the full rows' tokens, and the text is a valid JSON prefix.
TEST(EngineOnModel, LogitCandidatesGiveTheFullRowTokensUnderJson) {
  ModelConfig config = preset_config("tiny");
  config.vocab_size = 151936;
  config.eos_token_ids = {151645};
  ModelWeights weights = make_dummy_weights(config, 9);
  // A synthetic token table: single bytes, then two-character pieces of JSON-ish text; the last ids unusable.
  auto table = std::make_shared<TokenBytes>();
  const std::string chars = "{}[],:\" \n0123456789-.eatrufsnlxyz";
  for (int32_t id = 0; id < int32_t(config.vocab_size); ++id) {
    table->bytes.push_back(
        id < 256 ? std::string(1, char(id))
                 : std::string{chars[size_t(id) % chars.size()], chars[size_t(id / 7) % chars.size()]});
    table->usable.push_back(id < 151600);
  }
  auto constraint = std::make_shared<JsonConstraint>();
  constraint->schema = JsonSchema::any_object();
  constraint->vocab = table;
  std::mt19937 rng(41);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(rng, 5 + i, int(config.vocab_size)));
    SamplingParams p = greedy(12, 0);
    p.json = constraint;
    p.seed = uint64_t(7 + i);
    if (i % 4 == 1) p.temperature = 0.8f;
    if (i % 4 == 2) p.temperature = 1.0f, p.top_k = 50;
    if (i % 4 == 3) p.temperature = 0.6f, p.top_p = 0.9f;
    params.push_back(p);
  }
  std::vector<GenerateOutput> want;
  {
    EngineOptions o = options();
    o.logit_candidates = 0;
    auto engine = Engine::create(weights, o);
    for (int i = 0; i < 8; ++i)
      want.push_back(generate(*engine, "f" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]));
  }
  for (const GenerateOutput& out : want) {
    JsonMatcher m(constraint->schema);
    for (int32_t t : out.tokens) {
      if (t == 151645) break;
      EXPECT_TRUE(m.advance(table->bytes[size_t(t)])) << t;
    }
  }
  for (int k : {16, 256}) {
    SCOPED_TRACE(k);
    EngineOptions o = options();
    o.logit_candidates = k;
    auto engine = Engine::create(weights, o);
    for (int i = 0; i < 8; ++i) {
      SCOPED_TRACE(i);
      expect_same_generation(
          generate(*engine, "c" + std::to_string(i), prompts[size_t(i)], params[size_t(i)]), want[size_t(i)]);
    }
  }
}

// The proof that the GDN snapshot is right: a prompt served mostly from the cache (KV pages and the recurrent
// state at the hit) gives the same tokens and logits as computing it from scratch. Page size 4 with odd
// lengths makes the hit end inside a page (copy-on-write).
// A hit reads the pages a previous request rounded; a cold run rounds the same K/V again. For every KV dtype.
TEST(EngineOnModel, PrefixHitGivesTheSameLogitsAsAColdRun) {
  for (DType kv : kKvDtypes)
    for (std::string model : {"tiny-moe", "small-moe-realdims"}) {
      SCOPED_TRACE(model + " " + std::string(dtype_name(kv)));
      ModelWeights weights = load_checkpoint(kModels + model);
      const int vocab = int(weights.config.vocab_size);
      auto warm = Engine::create(weights, options(4, true, 16, kv));
      auto cold = Engine::create(weights, options(4, /*prefix_cache=*/false, 16, kv));
      std::mt19937 rng(22);
      auto first_prompt = random_prompt(rng, 41, vocab);
      auto first = generate(*warm, "first", first_prompt, greedy(7, 5));
      auto prompt = concat(concat(first_prompt, first.tokens), random_prompt(rng, 9, vocab));
      auto hit = generate(*warm, "second", prompt, greedy(8, 5));
      EXPECT_EQ(hit.usage.cached_tokens, 41 + 7 - 1);
      auto miss = generate(*cold, "second", prompt, greedy(8, 5));
      EXPECT_EQ(miss.usage.cached_tokens, 0);
      expect_same_generation(hit, miss);
    }
}

TEST(EngineOnModel, MultiTurnConversationResumesFromThePreviousTurnsEnd) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe");
  auto warm = Engine::create(weights, options(16));
  auto cold = Engine::create(weights, options(16, false));
  std::mt19937 rng(23);
  std::vector<int32_t> conversation = random_prompt(rng, 30, 512);
  for (int turn = 0; turn < 5; ++turn) {
    SCOPED_TRACE(turn);
    auto out = generate(*warm, "w" + std::to_string(turn), conversation, greedy(6, 2));
    if (turn > 0) {
      EXPECT_EQ(out.usage.cached_tokens, int64_t(conversation.size()) - 10 - 1);  // all but the new text
    }
    expect_same_generation(out, generate(*cold, "c" + std::to_string(turn), conversation, greedy(6, 2)));
    conversation = concat(concat(conversation, out.tokens), random_prompt(rng, 10, 512));
  }
}

// Preemption on the real model: 16 requests of up to 100 tokens (half sharing a 40-token prefix, some sampled
// with a seed, two priorities, half arriving while the others run) on a KV pool of 160 tokens. Requests are
// preempted and resume from their snapshots (or recompute), yet every request gets exactly the tokens it gets
// on a roomy pool, every invariant holds after every step, and at the end every page and slot is back in its
// pool.
TEST(EngineOnModel, PreemptionOnASmallPoolChangesNoTokenAndLeaksNothing) {
  ModelWeights weights = load_checkpoint(kModels + "tiny-moe");
  const int vocab = int(weights.config.vocab_size), n = 16;
  std::mt19937 rng(25);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto shared = random_prompt(rng, 40, vocab);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  std::vector<int> priorities;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(i % 2 ? concat(shared, random_prompt(rng, uniform(1, 10), vocab))
                            : random_prompt(rng, uniform(20, 50), vocab));
    SamplingParams p = greedy(uniform(20, 50), 2);
    if (i % 4 == 3) {
      p.temperature = 0.8f;
      p.top_k = 20;
      p.seed = uint64_t(i);
    }
    params.push_back(p);
    priorities.push_back(uniform(0, 1));
  }
  auto run = [&](EngineOptions o, EngineStats* final_stats) {
    EngineCore core(make_qwen35_runner(weights, nullptr), o);
    std::vector<std::shared_ptr<OutputStream>> streams;
    auto add = [&](int i) {
      GenerateRequest r{.id = "r" + std::to_string(i),
                        .prompt = prompts[size_t(i)],
                        .params = params[size_t(i)],
                        .priority = priorities[size_t(i)]};
      streams.push_back(std::make_shared<OutputStream>());
      r.on_output = streams.back()->sink();
      core.validate(r);
      core.add(std::move(r));
    };
    for (int i = 0; i < n / 2; ++i) add(i);
    for (int step = 0; step < 20000 && (!core.idle() || int(streams.size()) < n); ++step) {
      if (step >= 10 && step % 5 == 0 && int(streams.size()) < n) add(int(streams.size()));
      core.step();
      core.deliver();
      core.check_invariants();
    }
    EXPECT_TRUE(core.idle());
    std::vector<GenerateOutput> outs;
    for (auto& s : streams) outs.push_back(s->collect());
    if (final_stats) {
      const EngineStats s = core.stats();
      EXPECT_EQ(s.running, 0);
      EXPECT_EQ(s.queued, 0);
      EXPECT_EQ(s.kv_pages_used, 0);
      EXPECT_EQ(s.live_slots_used, 0);
      EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, s.kv_pages_total);
      core.flush_cache();
      *final_stats = core.stats();
    }
    return outs;
  };

  // bf16 and FP8 pages too: preempted requests recompute or resume over pages rounded the same way.
  for (DType kv : kKvDtypes) {
    SCOPED_TRACE(std::string(dtype_name(kv)));
    EngineOptions roomy = options(4, true, 16, kv);
    const auto want = run(roomy, nullptr);

    auto probe = make_qwen35_runner(weights, nullptr);
    EngineOptions small = options(4, true, 16, kv);
    // Snapshots may take at most half of what the live slots leave: narrower pages leave room for fewer.
    const int snapshots = kv == DType::F32 ? 4 : kv == DType::BF16 ? 2 : 1;
    small.max_running_requests = 8;
    small.snapshot_slots = snapshots;
    small.max_model_len = 100;
    KvCacheSpec page = probe->kv_cache_spec(4, 1);
    page.dtype = kv;
    small.cache_memory_bytes = (8 + snapshots) * probe->state_cache_spec(1).bytes_per_slot() +
                               40 * page.bytes_per_page();  // 40 pages of 4
    {
      EngineCore sized(make_qwen35_runner(weights, nullptr), small);
      ASSERT_EQ(sized.capacity().kv_tokens, 160);
      ASSERT_EQ(sized.capacity().snapshot_slots, snapshots);
    }
    EngineStats stats;
    const auto got = run(small, &stats);
    ASSERT_EQ(got.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(got[size_t(i)].finish_reason, FinishReason::Length);
      EXPECT_EQ(int(got[size_t(i)].tokens.size()), *params[size_t(i)].max_tokens);
      expect_same_generation(got[size_t(i)], want[size_t(i)]);
    }
    EXPECT_GT(stats.preemptions, 0u);
    EXPECT_GT(stats.prefix_cache_hits, 0u);
    EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total);
    EXPECT_EQ(stats.kv_pages_cached, 0);
    EXPECT_EQ(stats.snapshot_slots_used, 0);
    EXPECT_EQ(stats.live_slots_used, 0);
  }
}

// The real accounting (size_caches over the caches' own byte counts) at the Qwen3.5-35B-A3B shape: 10
// attention layers of 2 KV heads x 256, 30 GDN layers (8192 conv channels, 32 x 128 x 128 fp32 state). In one
// 64 GiB cache budget with the same live slots, a bf16 cache holds twice the float32 tokens and FP8 four
// times; and how many 8K-context sequences fit at once (each a live slot and 512 pages, no snapshots).
TEST(EngineCapacity, Bf16KvHoldsTwiceTheFloat32TokensAtThe35bShape) {
  KvCacheSpec kv;
  kv.num_layers = 10, kv.num_kv_heads = 2, kv.head_dim = 256;
  StateCacheSpec state{30, 8192, 4, 32, 128, 128, 0};
  const int64_t budget = int64_t(64) << 30, context = 8192;
  auto sized = [&](DType dtype, int live) {
    kv.dtype = dtype;
    EngineOptions o;
    o.cache_memory_bytes = budget;
    o.max_running_requests = live;
    o.snapshot_slots = 0;
    o.max_model_len = context;
    return size_caches(kv, state, o, 262144, 0);
  };
  const int64_t f32 = sized(DType::F32, 16).kv_tokens, bf16 = sized(DType::BF16, 16).kv_tokens,
                fp8 = sized(DType::F8_E4M3, 16).kv_tokens;
  EXPECT_GE(bf16, 2 * f32);
  EXPECT_GE(fp8, 2 * bf16);
  for (DType dtype : kKvDtypes) {
    int most = 0;  // the most live slots whose 8K contexts all fit in the pages that remain
    for (int n = 1; n < 4000; ++n) {
      try {
        if (sized(dtype, n).kv_pages < n * (context / 16)) break;
      } catch (const Error&) {  // not even one context fits beside n slots
        break;
      }
      most = n;
    }
    std::printf(
        "35B-A3B, 64 GiB cache budget, KV %s: %.0f KiB/token, %lld tokens at 16 running, "
        "%d concurrent 8K-context sequences\n",
        std::string(kv_cache_dtype_name(dtype)).c_str(), double(kv.bytes_per_token()) / 1024,
        static_cast<long long>(sized(dtype, 16).kv_tokens), most);
    EXPECT_GT(most, 0);
  }
}

// Running requests sized from a 64 GiB budget at the 35B-A3B shape (serve's rule): each gets its live slot,
// its snapshot slots and 8192 tokens of KV after one 262,144-token request's pages, and one more would not
// fit; a narrower KV or state buys more of them.
TEST(EngineCapacity, RunningRequestsSizedFromTheBudgetAtThe35bShape) {
  KvCacheSpec kv;
  kv.num_layers = 10, kv.num_kv_heads = 2, kv.head_dim = 256;
  const int64_t budget = int64_t(64) << 30, context = 8192, model_len = 262144;
  auto sized = [&](DType kv_dtype, DType state_dtype, bool from_memory, int running) {
    kv.dtype = kv_dtype;
    StateCacheSpec state{30, 8192, 4, 32, 128, 128, 0};
    state.dtype = state_dtype;
    EngineOptions o;
    o.cache_memory_bytes = budget;
    o.max_running_requests = running;
    o.running_from_memory = from_memory;
    return size_caches(kv, state, o, model_len, 0);
  };
  std::map<std::pair<DType, DType>, int> running;
  for (DType state_dtype : {DType::F32, DType::BF16}) {
    for (DType kv_dtype : kKvDtypes) {
      const EngineCapacity cap = sized(kv_dtype, state_dtype, true, 100000);
      const int n = cap.live_slots;
      EXPECT_EQ(cap.running_context, context);
      EXPECT_GT(cap.snapshot_slots, 0);  // two per request, or half of what the live slots leave
      EXPECT_LE(cap.snapshot_slots, 2 * n);
      // n requests of 8K tokens and one of the full length fit in the pages; n + 1 do not.
      const int64_t pages = context / 16, extra = model_len / 16 + 1 - pages;
      EXPECT_GE(cap.kv_pages, n * pages + extra);
      EXPECT_LT(sized(kv_dtype, state_dtype, false, n + 1).kv_pages, (n + 1) * pages + extra);
      EXPECT_EQ(sized(kv_dtype, state_dtype, true, 16).live_slots, 16);  // the cap
      running[{kv_dtype, state_dtype}] = n;
      std::printf("35B-A3B, 64 GiB, KV %s, state %s: %d running requests at 8K tokens each\n",
                  std::string(kv_cache_dtype_name(kv_dtype)).c_str(),
                  state_dtype == DType::F32 ? "f32" : "bf16", n);
    }
  }
  auto at = [&](DType kv_dtype, DType state_dtype) { return running[{kv_dtype, state_dtype}]; };
  EXPECT_GT(at(DType::BF16, DType::F32), at(DType::F32, DType::F32));
  EXPECT_GT(at(DType::F8_E4M3, DType::F32), at(DType::BF16, DType::F32));
  EXPECT_GT(at(DType::BF16, DType::BF16), at(DType::BF16, DType::F32));
}

// EngineOptions::state_dtype = BF16: a budget holds the same slots in half the bytes (the rest becomes KV
// pages), and requests run through bf16 snapshots with prefix hits like a float32 pool. Their tokens start
// out the same, then may part at a near-tie of this random-weight model's flat logits (greedy over 1024
// tokens; tests/model/state_dtype_test.cpp bounds the logits themselves), so only the first is compared.
TEST(EngineOnModel, Bf16StateHalvesTheSlotBytesAndServesLikeFloat32) {
  ModelWeights weights = load_checkpoint(kModels + "small-moe-realdims");
  const int vocab = int(weights.config.vocab_size);
  EngineOptions o = options(16);
  o.max_running_requests = 4;
  o.snapshot_slots = 4;
  o.max_model_len = 256;
  auto f32 = Engine::create(weights, o);
  o.state_dtype = StateDtype::BF16;
  auto bf16 = Engine::create(weights, o);
  const EngineCapacity &a = f32->capacity(), &b = bf16->capacity();
  EXPECT_EQ(b.live_slots, a.live_slots);
  EXPECT_EQ(b.snapshot_slots, a.snapshot_slots);
  EXPECT_EQ(2 * b.state_bytes, a.state_bytes);
  EXPECT_GT(b.kv_pages, a.kv_pages);
  EXPECT_NE(b.summary().find("MiB, bf16)"), std::string::npos) << b.summary();

  std::mt19937 rng(26);
  const auto shared = random_prompt(rng, 48, vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(concat(shared, random_prompt(rng, 8 + i, vocab)));
  std::vector<std::shared_ptr<OutputStream>> sa, sb;
  for (int i = 0; i < 8; ++i) {
    sa.push_back(submit(*f32, "a" + std::to_string(i), prompts[size_t(i)], greedy(48)));
    sb.push_back(submit(*bf16, "b" + std::to_string(i), prompts[size_t(i)], greedy(48)));
  }
  int64_t cached = 0;
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    const auto want = sa[size_t(i)]->collect(), got = sb[size_t(i)]->collect();
    EXPECT_EQ(got.finish_reason, FinishReason::Length);
    ASSERT_EQ(got.tokens.size(), 48u);
    EXPECT_EQ(got.tokens[0], want.tokens[0]);
    cached += got.usage.cached_tokens;
  }
  EXPECT_GT(cached, 0);  // later requests resumed from bf16 snapshots of the shared prefix
  const EngineStats s = bf16->stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.live_slots_used, 0);
}

}  // namespace
}  // namespace moeserve
