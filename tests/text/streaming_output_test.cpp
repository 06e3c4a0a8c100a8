#include "text/streaming_output.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace moeserve::text {
namespace {

using testing::qwen3;

struct Collected {
  ParsedOutput from_deltas;
  ParsedOutput message;
  bool stopped;
  std::string text;
};

Collected run(const std::string& generated, std::vector<std::string> stops, const OutputParserOptions& o) {
  StreamingOutput s(&qwen3(), {.stops = std::move(stops), .parser = o});
  Collected c;
  auto absorb = [&](const OutputDelta& d) {
    c.from_deltas.reasoning_content += d.reasoning_content;
    c.from_deltas.content += d.content;
    for (const auto& t : d.tool_calls) {
      if (!t.id.empty()) c.from_deltas.tool_calls.push_back({t.id, t.name, ""});
      c.from_deltas.tool_calls.at(t.index).arguments += t.arguments;
    }
  };
  for (int32_t id : qwen3().encode(generated)) {
    absorb(s.push(id));
    if (s.stopped()) break;
  }
  absorb(s.finish());
  c.message = s.message();
  c.stopped = s.stopped();
  c.text = s.text();
  return c;
}

TEST(StreamingOutput, TokensToReasoningContentAndToolCalls) {
  OutputParserOptions o{"qwen3", "qwen3_coder", true, nullptr};
  std::string gen =
      "先想一想。\n</"
      "think>\n\n好的，我来查。\n\n<tool_call>\n<function=search>\n<parameter=query>\n北京天气\n</"
      "parameter>\n"
      "</function>\n</tool_call><|im_end|>";
  Collected c = run(gen, {}, o);
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(c.message.reasoning_content, "先想一想。");
  EXPECT_EQ(c.message.content, "好的，我来查。");
  ASSERT_EQ(c.message.tool_calls.size(), 1u);
  EXPECT_EQ(c.message.tool_calls[0].arguments, R"({"query": "北京天气"})");
  EXPECT_EQ(c.from_deltas.reasoning_content, c.message.reasoning_content);
  EXPECT_EQ(c.from_deltas.content, c.message.content);
  ASSERT_EQ(c.from_deltas.tool_calls.size(), 1u);
  EXPECT_EQ(c.from_deltas.tool_calls[0].arguments, c.message.tool_calls[0].arguments);
}

TEST(StreamingOutput, StopStringEndsTheStreamWithoutItsText) {
  Collected c = run("Count: one, two, three, STOP here", {"STOP"}, OutputParserOptions{});
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.message.content, "Count: one, two, three, ");
  EXPECT_EQ(c.from_deltas.content, c.message.content);
  EXPECT_EQ(c.text, c.message.content);
}

}  // namespace
}  // namespace moeserve::text
