// The prompt generator and the dialogues of the four scenarios, without a network.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loadgen/prompt.h"
#include "loadgen/scenario.h"
#include "common/error.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

TEST(Prompt, SameSeedAndStreamGiveTheSameText) {
  PromptGenerator a(42), b(42), c(43);
  EXPECT_EQ(a.text(100, 5), b.text(100, 5));
  EXPECT_NE(a.text(100, 5), a.text(100, 6));
  EXPECT_NE(a.text(100, 5), c.text(100, 5));
  EXPECT_NE(a.text(50, 1).substr(0, 20), a.text(50, 2).substr(0, 20));  // no shared prefix between requests
}

TEST(Prompt, WithoutTokenizerLengthIsWordsAndFullStops) {
  PromptGenerator g(1);
  EXPECT_FALSE(g.exact());
  for (size_t n : {0, 1, 2, 17, 256, 1000}) EXPECT_EQ(g.count(g.text(n, n)), n) << n;
  EXPECT_EQ(g.count("one two. three"), 4u);
}

// A tokenizer that merges some neighbouring words ("of the" is one token), as real BPE vocabularies can:
// the generator must still hit the length exactly.
size_t merging_counter(std::string_view text) {
  size_t words = 0, merges = 0;
  bool in_word = false;
  for (char c : text) {
    if (c == ' ' || c == '.') {
      words += c == '.';
      in_word = false;
    } else if (!in_word) {
      ++words;
      in_word = true;
    }
  }
  for (size_t p = text.find("of the"); p != std::string_view::npos; p = text.find("of the", p + 1)) ++merges;
  return words - merges;
}

TEST(Prompt, TokenCounterMakesLengthsExact) {
  PromptGenerator g(7, merging_counter);
  EXPECT_TRUE(g.exact());
  for (size_t n : {1, 5, 64, 256, 2048})
    for (uint64_t stream = 0; stream < 5; ++stream) EXPECT_EQ(merging_counter(g.text(n, stream)), n);
}

// The real Qwen3 tokenizer (scripts/fetch-test-data.sh puts it in .cache/): every length is exact.
TEST(Prompt, ExactLengthsWithTheQwen3Tokenizer) {
  TokenCounter qwen3 = load_token_counter(".cache/tokenizer-qwen3");
  PromptGenerator g(11, qwen3);
  for (size_t n : {1, 2, 16, 128, 256, 1000, 4096})
    for (uint64_t stream = 0; stream < 3; ++stream)
      EXPECT_EQ(qwen3(g.text(n, stream)), n) << n << " " << stream;
  EXPECT_EQ(load_token_counter(".cache/tokenizer-qwen3/tokenizer.json")("Hello world"), 2u);
  EXPECT_THROW(load_token_counter("/nonexistent/tokenizer.json"), Error);
}

TEST(Prompt, RejectsATokenizerThatSplitsWords) {
  EXPECT_THROW(PromptGenerator(1, [](std::string_view t) { return t.size(); }), Error);
}

WorkloadOptions options(Scenario s) {
  WorkloadOptions o;
  o.scenario = s;
  o.model = "m";
  o.input_len = 32;
  o.output_len = 8;
  o.turns = 3;
  return o;
}

Reply reply(std::string content) {
  Reply r;
  r.content = std::move(content);
  return r;
}

TEST(Scenario, NamesRoundTrip) {
  for (Scenario s : all_scenarios()) EXPECT_EQ(parse_scenario(scenario_name(s)), s);
  EXPECT_THROW(parse_scenario("chat"), Error);
}

TEST(Scenario, SingleTurnAsksForExactOutputLength) {
  PromptGenerator g(1);
  auto o = options(Scenario::single_turn);
  o.extra_body = {{"top_k", 1}};
  Conversation c(o, g, 0);
  TurnRequest r = c.next();
  json body = json::parse(r.body);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["min_tokens"], 8);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["top_k"], 1);
  EXPECT_FALSE(body.contains("tools"));
  ASSERT_EQ(body["messages"].size(), 1u);
  EXPECT_EQ(g.count(body["messages"][0]["content"].get<std::string>()), 32u);
  EXPECT_EQ(r.expected_input_tokens, 32u);
  EXPECT_TRUE(r.exact_output);
  c.complete(reply("ok"));
  EXPECT_TRUE(c.done());

  o.ignore_eos = false;
  Conversation plain(o, g, 0);
  json b2 = json::parse(plain.next().body);
  EXPECT_FALSE(b2.contains("ignore_eos"));
  EXPECT_FALSE(b2.contains("min_tokens"));
}

TEST(Scenario, LongGenerationUsesTheLongLength) {
  PromptGenerator g(1);
  auto o = options(Scenario::long_gen);
  o.long_output_len = 4096;
  Conversation c(o, g, 0);
  EXPECT_EQ(json::parse(c.next().body)["max_tokens"], 4096);
}

TEST(Scenario, MultiTurnCarriesTheConversationForward) {
  PromptGenerator g(1);
  Conversation c(options(Scenario::multi_turn), g, 4);
  json first = json::parse(c.next().body);
  c.complete(reply("answer one"));
  json second = json::parse(c.next().body);
  c.complete(reply("answer two"));
  json third = json::parse(c.next().body);
  c.complete(reply("answer three"));
  EXPECT_TRUE(c.done());
  ASSERT_EQ(third["messages"].size(), 5u);
  // Each prompt is the previous prompt, the reply to it, and a new user message.
  EXPECT_EQ(second["messages"][0], first["messages"][0]);
  EXPECT_EQ(second["messages"][1], (json{{"role", "assistant"}, {"content", "answer one"}}));
  EXPECT_EQ(third["messages"][3], (json{{"role", "assistant"}, {"content", "answer two"}}));
  EXPECT_EQ(third["messages"][4]["role"], "user");
  EXPECT_NE(third["messages"][4]["content"], third["messages"][2]["content"]);
}

TEST(Scenario, PromptSetsAndScenariosShareNoPrompt) {
  PromptGenerator g(1);
  auto first_prompt = [&](Scenario s, size_t set) {
    auto o = options(s);
    o.prompt_set = set;
    Conversation c(o, g, 0);
    return json::parse(c.next().body)["messages"][0]["content"].get<std::string>();
  };
  EXPECT_EQ(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::single_turn, 0));
  EXPECT_NE(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::single_turn, 1));
  EXPECT_NE(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::multi_turn, 0));
}

TEST(Scenario, FailedTurnEndsTheDialogue) {
  PromptGenerator g(1);
  Conversation c(options(Scenario::multi_turn), g, 0);
  c.next();
  c.abandon();
  EXPECT_TRUE(c.done());
}

TEST(Scenario, ToolCallFeedsTheResultBack) {
  PromptGenerator g(1);
  auto o = options(Scenario::tool_call);
  Conversation c(o, g, 0);
  TurnRequest first = c.next();
  json b1 = json::parse(first.body);
  ASSERT_TRUE(b1.contains("tools"));
  EXPECT_EQ(b1["tools"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(b1["tool_choice"], "auto");
  EXPECT_FALSE(b1.contains("ignore_eos"));  // the model must be free to end its tool call
  EXPECT_FALSE(first.exact_output);
  EXPECT_NEAR(static_cast<double>(first.expected_input_tokens), 32, 1);

  Reply r;
  r.tool_calls.push_back({"call_9", "get_weather", R"({"city": "Paris"})"});
  c.complete(r);
  EXPECT_TRUE(c.tool_call_returned());
  TurnRequest second = c.next();
  json b2 = json::parse(second.body);
  EXPECT_TRUE(b2.contains("tools"));
  EXPECT_EQ(b2["ignore_eos"], true);
  const json& m = b2["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_TRUE(m[1]["content"].is_null());
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_9");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "call_9");
  EXPECT_EQ(json::parse(m[2]["content"].get<std::string>())["condition"], "sunny");
  c.complete(reply("It is sunny."));
  EXPECT_TRUE(c.done());
}

TEST(Scenario, ToolCallStandsInACallWhenTheModelMadeNone) {
  PromptGenerator g(1);
  auto o = options(Scenario::tool_call);
  Conversation c(o, g, 1);
  c.next();
  c.complete(reply("I would rather chat."));
  EXPECT_FALSE(c.tool_call_returned());
  json m = json::parse(c.next().body)["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["content"], "I would rather chat.");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
}

}  // namespace
}  // namespace moeserve::loadgen
