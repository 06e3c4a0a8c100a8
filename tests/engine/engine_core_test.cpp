#include "engine/engine_core.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

#include "engine/request_limits.h"
#include "fake_model.h"
#include "requests.h"

namespace moeserve {
namespace {

using engine_test::concat;
using engine_test::greedy;

using fake::FakeModel;

struct Harness {
  explicit Harness(EngineOptions options = defaults(), int64_t vocab = 32) {
    auto m = std::make_unique<FakeModel>(vocab);
    model = m.get();
    core = std::make_unique<EngineCore>(std::move(m), options);
  }
  static EngineOptions defaults() {
    EngineOptions o;
    o.page_size = 4;
    o.cache_memory_bytes = 1 << 20;
    o.max_running_requests = 16;
    o.chunked_prefill_size = 32;
    o.max_num_batched_tokens = 64;
    return o;
  }

  std::shared_ptr<OutputStream> submit(const std::string& id, std::vector<int32_t> prompt, SamplingParams p,
                                       int priority = 0, int64_t snapshot_hint = 0) {
    GenerateRequest r{.id = id,
                      .prompt = std::move(prompt),
                      .params = std::move(p),
                      .priority = priority,
                      .snapshot_hint = snapshot_hint};
    auto stream = std::make_shared<OutputStream>();
    r.on_output = stream->sink();
    core->validate(r);
    core->add(std::move(r));
    return stream;
  }
  void step() {
    core->step();
    core->deliver();
    core->check_invariants();
  }
  bool cancel(const std::string& id) {
    bool live = core->cancel(id);
    core->deliver();
    return live;
  }
  void run_until_idle(int max_steps = 100000) {
    for (int i = 0; i < max_steps && !core->idle(); ++i) step();
    ASSERT_TRUE(core->idle());
  }
  GenerateOutput generate(const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    auto s = submit(id, std::move(prompt), std::move(p));
    run_until_idle();
    return s->collect();
  }

  FakeModel* model;
  std::unique_ptr<EngineCore> core;
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab = 32) {
  return engine_test::random_prompt(rng, n, vocab, /*lowest=*/1);  // 0 is the fake model's eos
}

TEST(EngineCore, GreedyMatchesReference) {
  Harness h;
  std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  auto out = h.generate("a", prompt, greedy(12));
  EXPECT_EQ(out.tokens, h.model->expected_greedy(prompt, 12));
  EXPECT_EQ(out.finish_reason, FinishReason::Length);
  EXPECT_EQ(out.usage.prompt_tokens, 8);
  EXPECT_EQ(out.usage.completion_tokens, 12);
}

TEST(EngineCore, BatchedEqualsAlone) {
  Harness h;
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(random_tokens(rng, std::uniform_int_distribution<int>(1, 100)(rng)));
    streams.push_back(h.submit("r" + std::to_string(i), prompts.back(), greedy(20)));
  }
  h.run_until_idle();
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(streams[size_t(i)]->collect().tokens, h.model->expected_greedy(prompts[size_t(i)], 20)) << i;
  // Requests really shared steps: far fewer steps than running them one after another.
  EXPECT_LT(h.model->steps, 16 * 20);
}

TEST(EngineCore, CacheHitEqualsMiss) {
  Harness h;
  std::mt19937 rng(2);
  auto prefix = random_tokens(rng, 60);
  auto first = h.generate("a", prefix, greedy(5));
  auto prompt = concat(concat(prefix, first.tokens), random_tokens(rng, 10));
  auto second = h.generate("b", prompt, greedy(8));
  EXPECT_GE(second.usage.cached_tokens, 64);  // prompt + output of the first, but its last token
  EXPECT_EQ(second.tokens, h.model->expected_greedy(prompt, 8));

  Harness cold;
  EXPECT_EQ(cold.generate("b", prompt, greedy(8)).tokens, second.tokens);
}

TEST(EngineCore, TenTurnConversationHitsEveryEarlierTurn) {
  Harness h;
  std::mt19937 rng(3);
  std::vector<int32_t> conversation = random_tokens(rng, 20);
  uint64_t queries = 0, hits = 0;
  for (int turn = 0; turn < 10; ++turn) {
    auto out = h.generate("t" + std::to_string(turn), conversation, greedy(6));
    EXPECT_EQ(out.tokens, h.model->expected_greedy(conversation, 6));
    // Everything but the 5 new tokens and the previous answer's last token (sampled, never fed back), which
    // the previous turn's end-of-request snapshot stops short of.
    const int64_t want = turn == 0 ? 0 : int64_t(conversation.size()) - 6;
    EXPECT_EQ(out.usage.cached_tokens, want) << "turn " << turn;
    queries += conversation.size();
    hits += uint64_t(want);
    conversation = concat(concat(conversation, out.tokens), random_tokens(rng, 5));
  }
  auto stats = h.core->stats();
  EXPECT_EQ(stats.prefix_cache_queries, queries);
  EXPECT_EQ(stats.prefix_cache_hits, hits);
}

TEST(EngineCore, RepeatedPromptHitsFromTheThirdTime) {
  EngineOptions o = Harness::defaults();
  o.chunked_prefill_size = o.max_num_batched_tokens = 256;  // one chunk: no snapshot inside the prompt
  Harness h(o);
  std::mt19937 rng(4);
  auto prompt = random_tokens(rng, 80);
  EXPECT_EQ(h.generate("1", prompt, greedy(3)).usage.cached_tokens, 0);
  // The second run finds the prompt's KV without a snapshot inside it: it files one at len - 1 on the way.
  EXPECT_EQ(h.generate("2", prompt, greedy(3)).usage.cached_tokens, 0);
  auto third = h.generate("3", prompt, greedy(3));
  EXPECT_EQ(third.usage.cached_tokens, 79);
  EXPECT_EQ(third.tokens, h.model->expected_greedy(prompt, 3));
}

// A chat prompt ends with a generation prompt the next turn does not repeat (the template re-renders the
// answer): the snapshot the caller asks for at that boundary is what the next turn and a repeat hit.
TEST(EngineCore, TurnBoundaryHintServesTheNextTurnAndARepeat) {
  EngineOptions o = Harness::defaults();
  o.chunked_prefill_size = o.max_num_batched_tokens = 256;  // one chunk: no chunk-boundary snapshots
  Harness h(o);
  std::mt19937 rng(8);
  const std::vector<int32_t> generation_prompt = {5, 6, 7};
  auto history = random_tokens(rng, 70);
  auto turn = [&](const std::string& id, const std::vector<int32_t>& conversation) {
    auto prompt = concat(conversation, generation_prompt);
    auto s = h.submit(id, prompt, greedy(4), 0, int64_t(conversation.size()));
    h.run_until_idle();
    auto out = s->collect();
    EXPECT_EQ(out.tokens, h.model->expected_greedy(prompt, 4)) << id;
    return out;
  };
  EXPECT_EQ(turn("1", history).usage.cached_tokens, 0);
  EXPECT_EQ(turn("repeat", history).usage.cached_tokens, 70);
  auto next = concat(concat(history, random_tokens(rng, 6)), random_tokens(rng, 40));  // answer + new message
  EXPECT_EQ(turn("2", next).usage.cached_tokens, 70);
  EXPECT_EQ(turn("2-repeat", next).usage.cached_tokens, int64_t(next.size()));
}

TEST(EngineCore, SharedSystemPromptGetsASnapshotAtTheBranchPoint) {
  Harness h;
  std::mt19937 rng(5);
  auto system = random_tokens(rng, 64);
  h.generate("a", concat(system, random_tokens(rng, 10)), greedy(2));
  h.generate("b", concat(system, random_tokens(rng, 10)), greedy(2));
  auto prompt = concat(system, random_tokens(rng, 10));
  auto c = h.generate("c", prompt, greedy(4));
  EXPECT_EQ(c.usage.cached_tokens, 64);
  EXPECT_EQ(c.tokens, h.model->expected_greedy(prompt, 4));
}

TEST(EngineCore, SimultaneousRequestsComputeTheirSharedPromptOnce) {
  EngineOptions o = Harness::defaults();
  o.chunked_prefill_size = o.max_num_batched_tokens = 256;
  Harness h(o);
  std::mt19937 rng(9);
  auto prompt = random_tokens(rng, 80);
  std::vector<std::shared_ptr<OutputStream>> samples;
  for (int i = 0; i < 4; ++i) {  // what a server does for n = 4
    SamplingParams p;
    p.max_tokens = 5;
    p.seed = uint64_t(i);
    samples.push_back(h.submit("n" + std::to_string(i), prompt, p));
  }
  h.run_until_idle();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(samples[size_t(i)]->collect().usage.cached_tokens, i == 0 ? 0 : 79) << i;
  EXPECT_EQ(h.core->stats().prefill_tokens, 80u + 3u);
}

TEST(EngineCore, LongPromptIsSnapshottedAtChunkBoundaries) {
  Harness h;  // chunks of 32
  std::mt19937 rng(6);
  auto doc = random_tokens(rng, 100);
  h.generate("a", concat(doc, random_tokens(rng, 5)), greedy(1));
  auto prompt = concat(doc, random_tokens(rng, 5));
  auto b = h.generate("b", prompt, greedy(3));
  EXPECT_EQ(b.usage.cached_tokens, 96);  // the last chunk boundary inside the shared document
  EXPECT_EQ(b.tokens, h.model->expected_greedy(prompt, 3));
}

TEST(EngineCore, PoolTooSmallPreemptsAndFinishesCorrectly) {
  EngineOptions o = Harness::defaults();
  o.cache_memory_bytes = 3000;  // about 160 tokens of KV for 8 requests of 90 tokens
  o.max_running_requests = 8;
  o.snapshot_slots = 4;
  o.max_model_len = 100;
  Harness h(o);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_tokens(rng, 40));
    streams.push_back(h.submit("r" + std::to_string(i), prompts.back(), greedy(50)));
  }
  h.run_until_idle();
  for (int i = 0; i < 8; ++i) {
    auto out = streams[size_t(i)]->collect();
    EXPECT_EQ(out.finish_reason, FinishReason::Length);
    EXPECT_EQ(out.tokens, h.model->expected_greedy(prompts[size_t(i)], 50)) << i;
  }
  auto s = h.core->stats();
  EXPECT_GT(s.preemptions, 0u);
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.live_slots_used, 0);
  h.core->flush_cache();
  s = h.core->stats();
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
  EXPECT_EQ(s.snapshot_slots_used, 0);
}

TEST(EngineCore, HigherPriorityArrivalPreemptsLowerPriorityWork) {
  EngineOptions o = Harness::defaults();
  o.max_running_requests = 2;
  Harness h(o);
  auto low1 = h.submit("low1", {1, 2, 3}, greedy(40), /*priority=*/1);
  auto low2 = h.submit("low2", {4, 5, 6}, greedy(40), 1);
  for (int i = 0; i < 5; ++i) h.step();
  auto urgent = h.submit("urgent", {7, 8, 9}, greedy(5), 0);
  for (int i = 0; i < 5; ++i) h.step();
  auto u = urgent->collect();  // finished within 5 steps while the low-priority ones still run
  EXPECT_EQ(u.tokens, h.model->expected_greedy({7, 8, 9}, 5));
  EXPECT_EQ(h.core->stats().preemptions, 1u);
  h.run_until_idle();
  EXPECT_EQ(low1->collect().tokens, h.model->expected_greedy({1, 2, 3}, 40));
  EXPECT_EQ(low2->collect().tokens, h.model->expected_greedy({4, 5, 6}, 40));
}

// The order in which waiting requests get the engine's one slot: the order of their first tokens.
std::vector<std::string> admission_order(
    Harness& h, const std::vector<std::tuple<std::string, std::vector<int32_t>, int>>& requests) {
  auto order = std::make_shared<std::vector<std::string>>();
  for (const auto& [id, prompt, priority] : requests) {
    GenerateRequest r{.id = id, .prompt = prompt, .params = greedy(2), .priority = priority};
    r.on_output = [order, id = id](const GenerateOutput&) {
      if (std::find(order->begin(), order->end(), id) == order->end()) order->push_back(id);
    };
    h.core->validate(r);
    h.core->add(std::move(r));
  }
  h.run_until_idle();
  return *order;
}

// One slot, a blocker holding it, and three requests waiting behind it: fcfs serves them in arrival order,
// lpm serves the one with the longest cached prefix first; priority comes before either.
TEST(EngineCore, WaitingRequestsAreAdmittedByPriorityThenPolicy) {
  std::mt19937 rng(13);
  const auto doc = random_tokens(rng, 64);
  const auto cold = random_tokens(rng, 20), short_tail = random_tokens(rng, 5),
             long_tail = random_tokens(rng, 10), urgent = random_tokens(rng, 12);
  const auto short_prompt = concat({doc.begin(), doc.begin() + 40}, short_tail);
  for (SchedulePolicy policy : {SchedulePolicy::Fcfs, SchedulePolicy::Lpm}) {
    SCOPED_TRACE(policy == SchedulePolicy::Lpm ? "lpm" : "fcfs");
    EngineOptions o = Harness::defaults();  // chunks of 32: a snapshot at 32 inside the document
    o.max_running_requests = 1;
    o.snapshot_slots = 8;
    o.policy = policy;
    Harness h(o);
    const auto warm = h.generate("warm", doc, greedy(2));  // snapshots at 32 and at its end, 65
    const auto long_prompt = concat(concat(doc, warm.tokens), long_tail);
    auto blocker =
        h.submit("blocker", {1, 2, 3}, greedy(3), /*priority=*/-5);  // holds the slot, never preempted
    h.step();
    auto order = admission_order(
        h, {{"cold", cold, 0}, {"short", short_prompt, 0}, {"long", long_prompt, 0}, {"urgent", urgent, -1}});
    EXPECT_EQ(blocker->collect().tokens.size(), 3u);
    if (policy == SchedulePolicy::Fcfs) {
      EXPECT_EQ(order, (std::vector<std::string>{"urgent", "cold", "short", "long"}));
    } else {  // cached prefixes: long 65, short 32, cold 0
      EXPECT_EQ(order, (std::vector<std::string>{"urgent", "long", "short", "cold"}));
    }
    EXPECT_EQ(h.core->stats().preemptions, 0u);
  }
}

// Lower values first (vLLM): with the same slot count, a priority-0 request overtakes priority-1 requests
// that arrived before it, and the priority-1 ones keep their arrival order among themselves.
TEST(EngineCore, LowerPriorityValueIsServedFirstAndTiesKeepArrivalOrder) {
  EngineOptions o = Harness::defaults();
  o.max_running_requests = 1;
  Harness h(o);
  auto blocker = h.submit("blocker", {9, 9, 9}, greedy(2), -1);
  h.step();
  auto order = admission_order(h, {{"a", {1, 2}, 1}, {"b", {3, 4}, 1}, {"c", {5, 6}, 0}, {"d", {7, 8}, 2}});
  EXPECT_EQ(order, (std::vector<std::string>{"c", "a", "b", "d"}));
}

TEST(EngineCore, CancelEndsTheStreamAndFreesPagesAtOnce) {
  Harness h;
  auto stream = h.submit("a", {1, 2, 3, 4, 5}, greedy(1000));
  h.step();
  h.step();
  EXPECT_GT(h.core->stats().kv_pages_used, 0);
  EXPECT_TRUE(h.cancel("a"));
  EXPECT_FALSE(h.cancel("a"));
  auto out = stream->collect();
  EXPECT_EQ(out.finish_reason, FinishReason::Abort);
  EXPECT_EQ(out.tokens.size(), 2u);
  EXPECT_TRUE(h.core->idle());
  EXPECT_EQ(h.core->stats().kv_pages_used, 0);
  EXPECT_EQ(h.core->stats().requests_aborted, 1u);
}

TEST(EngineCore, StopsOnStopTokenEosAndLength) {
  Harness h;
  std::vector<int32_t> prompt = {7, 7, 7};
  auto ref = h.model->expected_greedy(prompt, 10);
  SamplingParams p = greedy(10);
  p.stop_token_ids = {ref[3]};
  auto out = h.generate("stop", prompt, p);
  auto first = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  EXPECT_EQ(out.tokens,
            std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));  // the stop token included
  EXPECT_EQ(out.finish_reason, FinishReason::Stop);
  EXPECT_EQ(out.stop_token, ref[3]);

  // The model's eos, and min_tokens holding it back.
  EngineOptions o = Harness::defaults();
  o.eos_token_ids = std::vector<int32_t>{ref[2]};
  Harness e(o);
  SamplingParams q = greedy(10);
  q.ignore_eos = false;
  auto eos_out = e.generate("eos", prompt, q);
  EXPECT_EQ(eos_out.finish_reason, FinishReason::Stop);
  EXPECT_EQ(eos_out.tokens.back(), ref[2]);
  q.min_tokens = 10;
  auto held = e.generate("held", prompt, q);
  EXPECT_EQ(held.finish_reason, FinishReason::Length);
  EXPECT_EQ(held.tokens.size(), 10u);
  for (int32_t t : held.tokens) EXPECT_NE(t, ref[2]);
}

TEST(EngineCore, SeededSamplingIsTheSameAloneOrBatched) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 1234;
  p.max_tokens = 30;
  p.ignore_eos = true;
  std::vector<int32_t> prompt = {5, 6, 7, 8};
  Harness alone;
  auto a = alone.generate("a", prompt, p);

  Harness batched;
  std::mt19937 rng(8);
  std::vector<std::shared_ptr<OutputStream>> others;
  for (int i = 0; i < 6; ++i) {
    SamplingParams q = p;
    q.seed.reset();
    others.push_back(batched.submit("o" + std::to_string(i), random_tokens(rng, 20), q));
  }
  auto s = batched.submit("a", prompt, p);
  batched.run_until_idle();
  EXPECT_EQ(s->collect().tokens, a.tokens);
}

TEST(EngineCore, LogprobsMatchTheModel) {
  Harness h;
  std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42 % 32};
  SamplingParams p = greedy(3);
  p.logprobs = true;
  p.top_logprobs = 2;
  p.prompt_logprobs = 1;
  auto out = h.generate("a", prompt, p);
  ASSERT_EQ(out.logprobs.size(), 3u);
  auto expect_entry = [&](const LogprobEntry& e, std::vector<int32_t> prefix, int32_t token) {
    auto l = h.model->logits_after(prefix);
    LogprobEntry want = compute_logprobs(l, token, 0);
    EXPECT_EQ(e.token, token);
    EXPECT_NEAR(e.logprob, want.logprob, 1e-5);
  };
  std::vector<int32_t> seq = prompt;
  for (size_t i = 0; i < 3; ++i) {
    expect_entry(out.logprobs[i], seq, out.tokens[i]);
    ASSERT_EQ(out.logprobs[i].top.size(), 2u);
    EXPECT_EQ(out.logprobs[i].top[0].token, out.tokens[i]);  // greedy picks the top one
    seq.push_back(out.tokens[i]);
  }
  ASSERT_EQ(out.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 1; i < prompt.size(); ++i)
    expect_entry(out.prompt_logprobs[i - 1], {prompt.begin(), prompt.begin() + int64_t(i)}, prompt[i]);
}

TEST(EngineCore, RejectsInvalidRequestsWithAMessage) {
  Harness h;
  auto bad = [&](GenerateRequest r) {
    try {
      h.core->validate(r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(bad({.id = "a", .prompt = {}, .params = {}}), "");
  EXPECT_NE(bad({.id = "a", .prompt = {1, 99}, .params = {}}).find("vocabulary"), std::string::npos);
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(bad({.id = "a", .prompt = {1}, .params = p}).find("top_p"), std::string::npos);
  p = {};
  p.max_tokens = 5000;
  EXPECT_NE(bad({.id = "a", .prompt = {1}, .params = p}).find("maximum context length"), std::string::npos);
  // The words the server's 400 uses for the same rule (engine/request_limits.h).
  EXPECT_EQ(bad({.id = "a", .prompt = {1}, .params = p}),
            "request a: " + context_overflow(1, 5000, h.core->capacity().max_model_len)->message);
  EXPECT_EQ(bad({.id = "a", .prompt = {1, 99}, .params = {}}),
            "request a: prompt position 1: " + outside_vocabulary(99, 32));  // the harness's vocabulary
}

// How many tokens arrived on a stream since the last call, appended to `into`; *finished set when the final
// event came.
int take_tokens(OutputStream& stream, std::vector<int32_t>& into, bool* finished = nullptr) {
  int n = 0;
  while (auto out = stream.try_next()) {
    n += int(out->tokens.size());
    into.insert(into.end(), out->tokens.begin(), out->tokens.end());
    if (finished && out->finished) *finished = true;
  }
  return n;
}

int64_t total(const std::vector<int64_t>& step) {
  int64_t sum = 0;
  for (int64_t n : step) sum += n;
  return sum;
}

// Greedy requests "d0", "d1", ... decoding side by side, and the tokens each has delivered so far.
struct Decoders {
  std::vector<std::shared_ptr<OutputStream>> streams;
  std::vector<std::vector<int32_t>> got;

  bool all_decoding() const {
    return std::all_of(got.begin(), got.end(), [](const auto& t) { return !t.empty(); });
  }
  // Takes what the last step delivered, expecting one token from each (`step` names it in a failure).
  void expect_one_token_each(int step) {
    for (size_t i = 0; i < streams.size(); ++i)
      EXPECT_EQ(take_tokens(*streams[i], got[i]), 1) << "decoder " << i << " skipped step " << step;
  }
};

// Submits one decoder of `max_tokens` per prompt and steps (at most 10 times) until all are decoding or not.
Decoders start_decoders(Harness& h, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  Decoders d;
  for (size_t i = 0; i < prompts.size(); ++i)
    d.streams.push_back(h.submit("d" + std::to_string(i), prompts[i], greedy(max_tokens)));
  d.got.resize(prompts.size());
  for (int step = 0; step < 10 && !d.all_decoding(); ++step) {
    h.step();
    for (size_t i = 0; i < prompts.size(); ++i) take_tokens(*d.streams[i], d.got[i]);
  }
  return d;
}

// The step budget: every decoding request decodes in every step while a long prompt prefills in the rest of
// the budget, so the prompt's chunks are budget - decodes tokens and its first token comes when they add up.
TEST(EngineCore, DecodesRunEveryStepAndPrefillFillsTheRestOfTheBudget) {
  EngineOptions o = Harness::defaults();
  o.max_num_batched_tokens = 16;
  o.chunked_prefill_size = 0;  // the step budget
  Harness h(o);
  std::mt19937 rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_tokens(rng, 4));
  Decoders decoders = start_decoders(h, prompts, 60);
  ASSERT_TRUE(decoders.all_decoding()) << "8 short prompts did not all start decoding";

  const auto long_prompt = random_tokens(rng, 100);
  auto long_stream = h.submit("long", long_prompt, greedy(3));
  std::vector<int32_t> long_tokens;
  int steps = 0;
  for (bool first = false; !first;) {
    ASSERT_LT(steps, 100);
    h.step();
    ++steps;
    decoders.expect_one_token_each(steps);
    first = take_tokens(*long_stream, long_tokens) > 0;
    const auto& batch = h.model->steps_log.back();
    ASSERT_EQ(batch.size(), 9u);
    if (!first) {
      EXPECT_EQ(total(batch), 16) << "step " << steps;  // the budget, filled
    }
    EXPECT_LE(total(batch), 16) << "step " << steps;
  }
  EXPECT_EQ(steps, (100 + 7) / 8);  // chunks of 16 - 8 decodes
  h.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    take_tokens(*decoders.streams[i], decoders.got[i]);
    EXPECT_EQ(decoders.got[i], h.model->expected_greedy(prompts[i], 60)) << i;
  }
  take_tokens(*long_stream, long_tokens);
  EXPECT_EQ(long_tokens, h.model->expected_greedy(long_prompt, 3));
  EXPECT_EQ(h.core->stats().preemptions, 0u);
}

// When decodes alone fill the budget, a waiting prompt still gets an eighth of it per step: the step runs
// over the budget by that much, and no decode is dropped for it.
TEST(EngineCore, PromptsKeepAShareOfAStepFullOfDecodes) {
  EngineOptions o = Harness::defaults();
  o.max_num_batched_tokens = 16;  // a prefill share of 2
  o.chunked_prefill_size = 0;
  o.max_running_requests = 20;
  Harness h(o);
  std::mt19937 rng(22);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(random_tokens(rng, 3));
  Decoders decoders = start_decoders(h, prompts, 40);
  ASSERT_TRUE(decoders.all_decoding());

  const auto prompt = random_tokens(rng, 20);
  auto waiting = h.submit("prompt", prompt, greedy(4));
  std::vector<int32_t> tokens;
  int steps = 0;
  for (bool first = false; !first;) {
    ASSERT_LT(steps, 100);
    h.step();
    ++steps;
    decoders.expect_one_token_each(steps);
    first = take_tokens(*waiting, tokens) > 0;
    EXPECT_EQ(total(h.model->steps_log.back()), 16 + 2) << "step " << steps;
  }
  EXPECT_EQ(steps, 20 / 2);
  h.run_until_idle();
  take_tokens(*waiting, tokens);
  EXPECT_EQ(tokens, h.model->expected_greedy(prompt, 4));
}

// Random arrivals: every step holds every decoding request once, no prefill chunk above the request chunk,
// and no more tokens than the budget (or the decodes plus the prefill share); the tokens are the reference.
TEST(EngineCore, StepsKeepTheBudgetTheChunkSizeAndEveryDecode) {
  EngineOptions o = Harness::defaults();
  o.max_num_batched_tokens = 24;  // a prefill share of 3
  o.chunked_prefill_size = 10;
  o.max_running_requests = 12;
  Harness h(o);
  std::mt19937 rng(23);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  struct Live {
    std::vector<int32_t> prompt;
    int max_tokens = 0;
    std::shared_ptr<OutputStream> stream;
    std::vector<int32_t> tokens;
  };
  std::map<std::string, Live> live;
  int full_steps = 0, checked = 0;
  for (int step = 0; step < 400; ++step) {
    if (step < 300 && uniform(0, 2) == 0) {
      std::string id = "r" + std::to_string(step);
      Live l{random_tokens(rng, uniform(1, 60)), uniform(1, 25), nullptr, {}};
      l.stream = h.submit(id, l.prompt, greedy(l.max_tokens));
      live[id] = std::move(l);
    }
    int decoding = 0;
    for (auto& [id, l] : live) decoding += !l.tokens.empty();
    const size_t passes = h.model->steps_log.size();
    h.step();
    if (h.model->steps_log.size() == passes) continue;  // idle
    const auto& batch = h.model->steps_log.back();
    for (int64_t n : batch) EXPECT_LE(n, 10);
    EXPECT_LE(total(batch), std::max<int64_t>(24, decoding + 3)) << "step " << step;
    full_steps += total(batch) == 24;
    for (auto it = live.begin(); it != live.end();) {
      Live& l = it->second;
      bool finished = false;
      const bool was_decoding = !l.tokens.empty();
      const int n = take_tokens(*l.stream, l.tokens, &finished);
      if (was_decoding) {
        EXPECT_EQ(n, 1) << it->first << " at step " << step;
      }
      if (!finished) {
        ++it;
        continue;
      }
      EXPECT_EQ(l.tokens, h.model->expected_greedy(l.prompt, l.max_tokens)) << it->first;
      ++checked;
      it = live.erase(it);
    }
  }
  h.run_until_idle();
  EXPECT_GT(checked, 60);
  EXPECT_GT(full_steps, 20);  // the budget did bind
  EXPECT_EQ(h.core->stats().preemptions, 0u);
}

// Sized from the budget: as many running requests as it holds with their state slots (live and the two
// snapshots each) and running_context tokens of KV, after one max_model_len request's pages; requests of
// that length then run that many at a time and none is preempted.
TEST(EngineCore, RunningRequestsSizedFromTheBudgetRunWithoutPreemption) {
  const FakeModel model;
  const int64_t slot = model.state_cache_spec(0).bytes_per_slot();
  const int64_t page = model.kv_cache_spec(4, 0).bytes_per_page();
  const int64_t per_request = 3 * slot + 8 * page;  // 32 tokens in pages of 4
  EngineOptions o = Harness::defaults();
  o.running_from_memory = true;
  o.running_context = 32;
  o.max_model_len = 64;
  o.max_running_requests = 64;
  o.cache_memory_bytes = (64 / 4 + 1 - 8) * page + 5 * per_request + per_request / 2;
  {
    EngineOptions capped = o;
    capped.max_running_requests = 3;
    EXPECT_EQ(Harness(capped).core->capacity().live_slots, 3);
  }
  Harness h(o);
  EXPECT_EQ(h.core->capacity().live_slots, 5);
  EXPECT_EQ(h.core->capacity().running_context, 32);
  std::mt19937 rng(24);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(random_tokens(rng, 20));
    streams.push_back(h.submit("r" + std::to_string(i), prompts.back(), greedy(12)));
  }
  int most = 0;
  for (int i = 0; i < 1000 && !h.core->idle(); ++i) {
    h.step();
    most = std::max(most, h.core->stats().running);
  }
  EXPECT_EQ(most, 5);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(streams[i]->collect().tokens, h.model->expected_greedy(prompts[i], 12)) << i;
  EXPECT_EQ(h.core->stats().preemptions, 0u);
}

// Requests arrive over time with random lengths, sampling settings and cancellations, on a cache small
// enough to evict and preempt; every invariant is checked after every step, and every greedy request that
// finishes must match the reference.
TEST(EngineCore, RandomSoakKeepsEveryInvariant) {
  EngineOptions o = Harness::defaults();
  o.cache_memory_bytes = 6000;
  o.max_running_requests = 6;
  o.snapshot_slots = 5;
  o.max_model_len = 160;
  o.chunked_prefill_size = 16;
  o.max_num_batched_tokens = 40;
  for (SchedulePolicy policy : {SchedulePolicy::Fcfs, SchedulePolicy::Lpm}) {
    o.policy = policy;
    Harness h(o);
    std::mt19937 rng(policy == SchedulePolicy::Fcfs ? 11 : 12);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<std::vector<int32_t>> families;
    for (int i = 0; i < 3; ++i) families.push_back(random_tokens(rng, 60));
    struct Live {
      std::vector<int32_t> prompt;
      SamplingParams params;
      std::shared_ptr<OutputStream> stream;
      std::vector<int32_t> tokens;
    };
    std::map<std::string, Live> live;
    int next = 0, finished = 0, verified = 0;
    auto drain = [&] {
      for (auto it = live.begin(); it != live.end();) {
        Live& l = it->second;
        bool done = false;
        while (auto out = l.stream->try_next()) {
          l.tokens.insert(l.tokens.end(), out->tokens.begin(), out->tokens.end());
          ASSERT_NE(out->finish_reason, FinishReason::Error) << out->error;
          done |= out->finished;
        }
        if (!done) {
          ++it;
          continue;
        }
        if (l.params.temperature ==
            0) {  // greedy: every token it got, cancelled or not, must be the reference
          EXPECT_EQ(l.tokens, h.model->expected_greedy(l.prompt, int(l.tokens.size()))) << it->first;
          ++verified;
        }
        ++finished;
        it = live.erase(it);
      }
    };
    for (int step = 0; step < 1500; ++step) {
      if (uniform(0, 2) == 0) {
        const auto& f = families[size_t(uniform(0, 2))];
        auto prompt = std::vector<int32_t>(f.begin(), f.begin() + uniform(0, 60));
        prompt = concat(prompt, random_tokens(rng, uniform(1, 20)));
        SamplingParams p = greedy(uniform(1, 30));
        if (uniform(0, 2) == 0) {
          p.temperature = 0.8f;
          p.top_k = uniform(0, 10);
          p.repetition_penalty = 1.1f;
        }
        std::string id = "r" + std::to_string(next++);
        live[id] = {prompt, p, h.submit(id, prompt, p, uniform(0, 2)), {}};
      }
      if (!live.empty() && uniform(0, 15) == 0) {
        auto it = std::next(live.begin(), uniform(0, int(live.size()) - 1));
        h.cancel(it->first);
      }
      h.step();
      drain();
    }
    h.run_until_idle();
    drain();
    EXPECT_TRUE(live.empty());
    EXPECT_GT(verified, 100);
    EXPECT_GT(finished, 100);
    EXPECT_GT(h.core->stats().preemptions + h.core->stats().prefix_cache_hits, 0u);
    EXPECT_EQ(h.core->stats().kv_pages_used, 0);
    h.core->flush_cache();
    EXPECT_EQ(h.core->stats().kv_pages_free, h.core->stats().kv_pages_total);
  }
}

}  // namespace
}  // namespace moeserve
