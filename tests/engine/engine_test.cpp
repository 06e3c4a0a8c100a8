#include "engine/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "fake_model.h"
#include "requests.h"

namespace moeserve {
namespace {

using engine_test::greedy;

using fake::FakeModel;

EngineOptions small_options() {
  EngineOptions o;
  o.page_size = 4;
  o.cache_memory_bytes = 1 << 20;
  o.max_running_requests = 8;
  return o;
}

GenerateRequest request(const std::string& id, std::vector<int32_t> prompt, SamplingParams p,
                        const std::shared_ptr<OutputStream>& stream) {
  GenerateRequest r{.id = id, .prompt = std::move(prompt), .params = std::move(p)};
  r.on_output = stream->sink();
  return r;
}

TEST(Engine, ServesRequestsSubmittedFromManyThreads) {
  FakeModel reference;
  auto engine = Engine::create(std::make_unique<FakeModel>(), small_options());
  EXPECT_GT(engine->capacity().kv_tokens, 0);
  std::vector<std::thread> clients;
  std::vector<int> ok(8, 0);
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> prompt = {c + 1, i + 1, c + i + 1, 5};
        auto stream = std::make_shared<OutputStream>();
        engine->submit(request(std::to_string(c) + "-" + std::to_string(i), prompt, greedy(10), stream));
        auto out = stream->collect();
        ok[size_t(c)] +=
            out.tokens == reference.expected_greedy(prompt, 10) && out.finish_reason == FinishReason::Length;
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int c = 0; c < 8; ++c) EXPECT_EQ(ok[size_t(c)], 3) << c;
  EXPECT_EQ(engine->stats().generation_tokens, 8u * 3 * 10);  // stats are published before events go out
}

TEST(Engine, CancelFromAnotherThreadEndsTheStreamAndFreesItsPages) {
  auto engine = Engine::create(std::make_unique<FakeModel>(), small_options());
  auto stream = std::make_shared<OutputStream>();
  engine->submit(request("long", {1, 2, 3}, greedy(4000), stream));
  auto first = stream->next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->tokens.size(), 1u);
  EXPECT_TRUE(engine->cancel("long"));
  GenerateOutput rest = stream->collect();
  EXPECT_EQ(rest.finish_reason, FinishReason::Abort);
  EXPECT_FALSE(engine->cancel("long"));  // no longer live

  auto stats = engine->stats();  // published before the final event went out
  EXPECT_EQ(stats.requests_aborted, 1u);
  EXPECT_EQ(stats.kv_pages_used, 0);
  EXPECT_EQ(stats.running, 0);
}

TEST(Engine, CallbackMayCancelItsOwnRequest) {
  auto engine = Engine::create(std::make_unique<FakeModel>(), small_options());
  auto stream = std::make_shared<OutputStream>();
  GenerateRequest r = request("self", {9, 9}, greedy(1000), stream);
  auto sink = r.on_output;
  Engine* e = engine.get();
  r.on_output = [sink, e](const GenerateOutput& out) {
    sink(out);
    if (out.usage.completion_tokens == 3) e->cancel(out.request_id);  // e.g. a stop string matched
  };
  engine->submit(std::move(r));
  auto out = stream->collect();
  EXPECT_EQ(out.finish_reason, FinishReason::Abort);
  EXPECT_GE(out.tokens.size(), 3u);
  EXPECT_LE(out.tokens.size(), 4u);  // within one step
}

TEST(Engine, SubmitRejectsDuplicatesAndRequestsAfterShutdown) {
  auto engine = Engine::create(std::make_unique<FakeModel>(), small_options());
  auto a = std::make_shared<OutputStream>();
  engine->submit(request("x", {1}, greedy(4000), a));
  EXPECT_THROW(engine->submit(request("x", {1}, greedy(1), std::make_shared<OutputStream>())), Error);
  engine->shutdown();
  EXPECT_EQ(a->collect().finish_reason, FinishReason::Abort);  // live requests end when the engine stops
  EXPECT_FALSE(engine->alive());
  EXPECT_THROW(engine->submit(request("y", {1}, greedy(1), std::make_shared<OutputStream>())), Error);
}

TEST(Engine, CreateRejectsABudgetThatCannotHoldOneRequest) {
  EngineOptions o = small_options();
  o.cache_memory_bytes = 2000;
  o.max_model_len = 4000;
  try {
    Engine::create(std::make_unique<FakeModel>(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max model length"), std::string::npos) << e.what();
  }
  o.max_model_len = 0;  // left to the model: shrinks to what fits instead
  auto engine = Engine::create(std::make_unique<FakeModel>(), o);
  EXPECT_LT(engine->capacity().max_model_len, 4096);
  EXPECT_LE(engine->capacity().max_model_len + o.page_size, engine->capacity().kv_tokens);
}

}  // namespace
}  // namespace moeserve
