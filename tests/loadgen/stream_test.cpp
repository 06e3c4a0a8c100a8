// SSE framing and the folding of OpenAI chat chunks into a reply and timings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loadgen/chat_stream.h"
#include "loadgen/sse.h"

namespace moeserve::loadgen {
namespace {

std::vector<std::string> parse_all(const std::string& bytes, size_t piece) {
  SseParser p;
  std::vector<std::string> events;
  for (size_t i = 0; i < bytes.size(); i += piece)
    p.feed(std::string_view(bytes).substr(i, piece), [&](std::string_view d) { events.emplace_back(d); });
  return events;
}

TEST(Sse, EventsSurviveAnySplitAndLineEnding) {
  const std::string stream =
      ": keep-alive comment\n\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata: first\r\ndata: second\r\n\r\n"
      "data:no-space\r\rdata: [DONE]\n\n";
  for (size_t piece : {1, 2, 3, 7, 1000}) {
    auto events = parse_all(stream, piece);
    ASSERT_EQ(events.size(), 4u) << "piece " << piece;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "first\nsecond");
    EXPECT_EQ(events[2], "no-space");
    EXPECT_EQ(events[3], "[DONE]");
  }
}

TEST(Sse, UnfinishedEventIsPending) {
  SseParser p;
  int n = 0;
  p.feed("data: {\"x\"", [&](std::string_view) { ++n; });
  EXPECT_EQ(n, 0);
  EXPECT_TRUE(p.pending());
  p.feed(":1}\n\n", [&](std::string_view) { ++n; });
  EXPECT_EQ(n, 1);
  EXPECT_FALSE(p.pending());
}

using std::chrono::milliseconds;

std::string chunk(const nlohmann::json& delta, const nlohmann::json& finish = nullptr) {
  return nlohmann::json{{"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}}}}.dump();
}

TEST(ChatStream, RoleChunkIsNotTheFirstToken) {
  Clock::time_point t0{};
  ChatStream s(t0);
  s.on_event(chunk({{"role", "assistant"}, {"content", ""}}), t0 + milliseconds(5));
  s.on_event(chunk({{"content", "Hel"}}), t0 + milliseconds(100));
  s.on_event(chunk({{"content", "lo"}}), t0 + milliseconds(130));
  s.on_event(chunk({{"reasoning_content", "hm"}}), t0 + milliseconds(170));
  s.on_event(chunk(nlohmann::json::object(), "length"), t0 + milliseconds(171));
  s.on_event(R"({"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,)"
             R"("prompt_tokens_details":{"cached_tokens":32}}})",
             t0 + milliseconds(172));
  s.on_event("[DONE]", t0 + milliseconds(173));
  RequestRecord r;
  s.fill(r, t0 + milliseconds(200));
  EXPECT_TRUE(s.done());
  EXPECT_FALSE(s.failed());
  EXPECT_EQ(s.reply().content, "Hello");
  EXPECT_EQ(s.reply().reasoning, "hm");
  EXPECT_NEAR(r.ttft_s, 0.100, 1e-9);
  EXPECT_NEAR(r.e2e_s, 0.200, 1e-9);
  ASSERT_EQ(r.itl_s.size(), 2u);
  EXPECT_NEAR(r.itl_s[0], 0.030, 1e-9);
  EXPECT_NEAR(r.itl_s[1], 0.040, 1e-9);
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(r.prompt_tokens, 40u);
  EXPECT_EQ(r.completion_tokens, 3u);
  EXPECT_EQ(r.cached_tokens, 32u);
  EXPECT_EQ(r.finish_reason, "length");
}

TEST(ChatStream, WithoutUsageChunksCountTokens) {
  ChatStream s(Clock::time_point{});
  s.on_event(chunk({{"content", "a"}}), Clock::time_point{} + milliseconds(1));
  s.on_event(chunk({{"content", "b"}}), Clock::time_point{} + milliseconds(2));
  RequestRecord r;
  s.fill(r, Clock::time_point{} + milliseconds(3));
  EXPECT_FALSE(r.usage_reported);
  EXPECT_EQ(r.completion_tokens, 2u);
}

TEST(ChatStream, ToolCallFragmentsAccumulateByIndex) {
  ChatStream s(Clock::time_point{});
  auto at = Clock::time_point{} + milliseconds(1);
  s.on_event(
      chunk(
          {{"tool_calls",
            {{{"index", 0}, {"id", "call_1"}, {"function", {{"name", "get_weather"}, {"arguments", ""}}}}}}}),
      at);
  s.on_event(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "{\"city\": "}}}}}}}), at);
  s.on_event(
      chunk({{"tool_calls", {{{"index", 1}, {"id", "call_2"}, {"function", {{"name", "search_web"}}}}}}}),
      at);
  s.on_event(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "\"Paris\"}"}}}}}}}), at);
  s.on_event(chunk(nlohmann::json::object(), "tool_calls"), at);
  ASSERT_EQ(s.reply().tool_calls.size(), 2u);
  EXPECT_EQ(s.reply().tool_calls[0].id, "call_1");
  EXPECT_EQ(s.reply().tool_calls[0].name, "get_weather");
  EXPECT_EQ(s.reply().tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(s.reply().tool_calls[1].name, "search_web");
  EXPECT_TRUE(s.finished());
}

TEST(ChatStream, ErrorEventsAndGarbageAreFailures) {
  ChatStream a(Clock::time_point{});
  a.on_event(R"({"error":{"message":"out of memory","type":"server_error"}})", Clock::time_point{});
  EXPECT_EQ(a.error_cause(), "stream_error");
  EXPECT_EQ(a.error_message(), "out of memory");
  ChatStream b(Clock::time_point{});
  b.on_event(R"({"object":"error","message":"bad things"})", Clock::time_point{});
  EXPECT_EQ(b.error_cause(), "stream_error");
  ChatStream c(Clock::time_point{});
  c.on_event("{truncated", Clock::time_point{});
  EXPECT_EQ(c.error_cause(), "bad_response");
}

TEST(ChatStream, NonStreamedResponseIsOneChunk) {
  ChatStream s(Clock::time_point{});
  s.on_full_response(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},)"
                     R"("finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}})",
                     Clock::time_point{} + milliseconds(50));
  RequestRecord r;
  s.fill(r, Clock::time_point{} + milliseconds(50));
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.reply().content, "hi there");
  EXPECT_NEAR(r.ttft_s, 0.05, 1e-9);
  EXPECT_EQ(r.completion_tokens, 2u);
}

}  // namespace
}  // namespace moeserve::loadgen
