#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moeserve::text {
namespace {

using ordered_json = nlohmann::ordered_json;

OutputParserOptions opts(std::string reasoning, std::string tools, bool inside = false,
                         ordered_json tool_list = nullptr) {
  OutputParserOptions o;
  o.reasoning_parser = std::move(reasoning);
  o.tool_parser = std::move(tools);
  o.starts_in_reasoning = inside;
  o.tools = std::move(tool_list);
  return o;
}

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"}, "metric": {"type": "boolean"},
    "filters": {"type": "object"}, "tags": {"type": ["array", "null"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}}}}}])");

// Feeds text in pieces of `step` bytes (0: all at once) and checks that the deltas add up to the result.
ParsedOutput streamed(std::string_view text, const OutputParserOptions& o, size_t step) {
  OutputParser p(o);
  ParsedOutput from_deltas;
  auto absorb = [&](const OutputDelta& d) {
    from_deltas.reasoning_content += d.reasoning_content;
    from_deltas.content += d.content;
    for (const auto& c : d.tool_calls) {
      if (!c.id.empty()) {
        EXPECT_EQ(static_cast<size_t>(c.index), from_deltas.tool_calls.size()) << "calls start in order";
        from_deltas.tool_calls.push_back({c.id, c.name, ""});
      }
      EXPECT_LT(static_cast<size_t>(c.index), from_deltas.tool_calls.size()) << "arguments before the name";
      if (static_cast<size_t>(c.index) < from_deltas.tool_calls.size())
        from_deltas.tool_calls[c.index].arguments += c.arguments;
    }
  };
  if (step == 0) step = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += step) absorb(p.push(text.substr(i, step)));
  absorb(p.finish());
  const ParsedOutput& r = p.result();
  EXPECT_EQ(from_deltas.reasoning_content, r.reasoning_content);
  EXPECT_EQ(from_deltas.content, r.content);
  EXPECT_EQ(from_deltas.tool_calls.size(), r.tool_calls.size());
  for (size_t i = 0; i < r.tool_calls.size() && i < from_deltas.tool_calls.size(); ++i) {
    EXPECT_EQ(from_deltas.tool_calls[i].name, r.tool_calls[i].name);
    EXPECT_EQ(from_deltas.tool_calls[i].arguments, r.tool_calls[i].arguments);
  }
  return r;
}

// Parses at once and in every chunk size up to 7 bytes: the results must not depend on chunking.
ParsedOutput parse_all_ways(std::string_view text, const OutputParserOptions& o) {
  ParsedOutput whole = streamed(text, o, 0);
  for (size_t step = 1; step <= 7; ++step) {
    ParsedOutput s = streamed(text, o, step);
    EXPECT_EQ(s.reasoning_content, whole.reasoning_content) << "step " << step;
    EXPECT_EQ(s.content, whole.content) << "step " << step;
    EXPECT_EQ(s.tool_calls.size(), whole.tool_calls.size()) << "step " << step;
    for (size_t i = 0; i < s.tool_calls.size() && i < whole.tool_calls.size(); ++i)
      EXPECT_EQ(s.tool_calls[i].arguments, whole.tool_calls[i].arguments) << "step " << step;
  }
  return whole;
}

TEST(ReasoningParser, SeparatesThinkBlockFromContent) {
  auto r = parse_all_ways("<think>\nLet me think.\n</think>\n\nThe answer is 4.", opts("qwen3", ""));
  EXPECT_EQ(r.reasoning_content, "Let me think.");
  EXPECT_EQ(r.content, "The answer is 4.");
}

TEST(ReasoningParser, OutputStartsInsideReasoningWhenPromptOpenedThink) {
  std::string prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n";
  ASSERT_TRUE(prompt_opens_reasoning(prompt));
  auto r = parse_all_ways("Hmm, 2+2.\n</think>\n\n4", opts("qwen3", "", true));
  EXPECT_EQ(r.reasoning_content, "Hmm, 2+2.");
  EXPECT_EQ(r.content, "4");
}

TEST(ReasoningParser, ThinkingDisabledPromptGivesPlainContent) {
  std::string prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_FALSE(prompt_opens_reasoning(prompt));
  auto r = parse_all_ways("Just 4.", opts("qwen3", "", prompt_opens_reasoning(prompt)));
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_EQ(r.content, "Just 4.");
}

TEST(ReasoningParser, TruncatedReasoningStaysReasoning) {
  auto r = parse_all_ways("still thinking about it\n", opts("qwen3", "", true));
  EXPECT_EQ(r.reasoning_content, "still thinking about it");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, WithoutParserEverythingIsContent) {
  auto r = parse_all_ways("<think>x</think>y", opts("", ""));
  EXPECT_EQ(r.content, "<think>x</think>y");
  EXPECT_EQ(parse_all_ways("a <think> b", opts("qwen3", "")).content, "a <think> b");
}

TEST(Qwen3CoderParser, ParsesTheTemplatesOwnToolCallRendering) {
  // Exactly what the Qwen3.5 template renders for two calls
  // (tests/fixtures/goldens/chat-template-goldens.json).
  std::string out =
      "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nBeijing\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
      "<parameter=query>\nParis weather\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_all_ways(out, opts("", "qwen3_coder", false, kTools));
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Beijing", "days": 3})");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"query": "Paris weather"})");
  EXPECT_EQ(r.tool_calls[0].id.substr(0, 5), "call_");
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(Qwen3CoderParser, ConvertsValuesByTheToolSchema) {
  std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n  Spaced \"quoted\"\nmultiline\n</parameter>\n"
      "<parameter=days>\nseven\n</parameter>\n<parameter=temp>\n21.5\n</"
      "parameter>\n<parameter=metric>\nTrue\n"
      "</parameter>\n<parameter=filters>\n{\"lang\": \"中文\"}\n</parameter>\n<parameter=tags>\n[1, \"a\"]\n"
      "</parameter>\n<parameter=unknown>\n42\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_all_ways(out, opts("", "qwen3_coder", false, kTools));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  auto args = ordered_json::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(args["city"], "  Spaced \"quoted\"\nmultiline");
  EXPECT_EQ(args["days"], "seven");  // not an integer: stays a string
  EXPECT_EQ(args["temp"], 21.5);
  EXPECT_EQ(args["metric"], true);
  EXPECT_EQ(args["filters"], ordered_json::parse(R"({"lang": "中文"})"));
  EXPECT_EQ(args["tags"], ordered_json::parse(R"([1, "a"])"));
  EXPECT_EQ(args["unknown"], "42");  // no schema: string
  EXPECT_EQ(r.content, "");
}

// The type a value converts by comes from anyOf (pydantic's Optional[int]), $refs and string enums too, and
// "null" is null only where the schema allows it (common/parameter_type.h, shared with the forced-call
// constraint).
TEST(Qwen3CoderParser, TypesFromAnyOfRefsAndEnumsAndNullOnlyWhereAllowed) {
  const ordered_json tools =
      ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "$defs": {"N": {"type": "integer"}},
    "properties": {"opt": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "ref": {"$ref": "#/$defs/N"},
      "unit": {"enum": ["c", "f"]}, "name": {"type": "string"}, "nick": {"type": ["string", "null"]},
      "big": {"type": "integer"}}}}}])");
  std::string out =
      "<tool_call>\n<function=f>\n<parameter=opt>\n5\n</parameter>\n<parameter=ref>\n7\n</parameter>\n"
      "<parameter=unit>\nc\n</parameter>\n<parameter=name>\nnull\n</parameter>\n<parameter=nick>\nNULL\n"
      "</parameter>\n<parameter=big>\n123456789012345678901\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_all_ways(out, opts("", "qwen3_coder", false, tools));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  auto args = ordered_json::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(args["opt"], 5);
  EXPECT_EQ(args["ref"], 7);
  EXPECT_EQ(args["unit"], "c");
  EXPECT_EQ(args["name"], "null");  // a string the schema does not let be null
  EXPECT_TRUE(args["nick"].is_null());
  EXPECT_TRUE(args["big"].is_number()) << args.dump();  // past long long: JSON's reading
}

TEST(Qwen3CoderParser, MalformedBlockStaysContentVerbatim) {
  std::string out = "Answer: use <tool_call>\nnot a function\n</tool_call> literally.";
  auto r = parse_all_ways(out, opts("", "qwen3_coder", false, kTools));
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, out);
  auto unterminated = parse_all_ways("text <tool_call> and then nothing", opts("", "qwen3_coder"));
  EXPECT_EQ(unterminated.content, "text <tool_call> and then nothing");
}

TEST(Qwen3CoderParser, TruncatedCallIsCompletedAndMissingCloseTagsTolerated) {
  auto r = parse_all_ways("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2",
                          opts("", "qwen3_coder", false, kTools));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Oslo", "days": 2})");
  auto no_params =
      parse_all_ways("<tool_call>\n<function=search>\n</function>\n</tool_call>", opts("", "qwen3_coder"));
  ASSERT_EQ(no_params.tool_calls.size(), 1u);
  EXPECT_EQ(no_params.tool_calls[0].arguments, "{}");
}

TEST(Qwen3CoderParser, WithReasoningFirst) {
  auto r = parse_all_ways(
      "I should call it.\n</think>\n\n<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n"
      "</function>\n</tool_call>",
      opts("qwen3", "qwen3_coder", true, kTools));
  EXPECT_EQ(r.reasoning_content, "I should call it.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": "x"})");
  // A tool call inside the reasoning is just reasoning.
  auto inside = parse_all_ways("<tool_call>\n<function=search>\n</function>\n</tool_call>\n</think>\nok",
                               opts("qwen3", "qwen3_coder", true));
  EXPECT_TRUE(inside.tool_calls.empty());
  EXPECT_EQ(inside.content, "ok");
}

TEST(HermesParser, ParsesJsonCallsAndKeepsBrokenOnesAsContent) {
  std::string out =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"北京\", \"days\": "
      "3}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
  auto r = parse_all_ways(out, opts("", "hermes"));
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "北京", "days": 3})");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_EQ(r.content, "");

  std::string broken = "Sure. <tool_call>\n{not json}\n</tool_call>";
  auto b = parse_all_ways(broken, opts("", "hermes"));
  EXPECT_TRUE(b.tool_calls.empty());
  EXPECT_EQ(b.content, broken);
}

TEST(HermesParser, StreamsTheNameBeforeTheArguments) {
  std::string out =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a long query\"}}\n</tool_call>";
  OutputParser p(opts("", "hermes"));
  size_t name_at = 0, args_at = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    OutputDelta d = p.push(out.substr(i, 1));
    for (const auto& c : d.tool_calls) {
      if (!c.name.empty() && !name_at) name_at = i;
      if (!c.arguments.empty() && !args_at) args_at = i;
    }
  }
  p.finish();
  EXPECT_GT(name_at, 0u);
  EXPECT_GT(args_at, name_at);
}

TEST(OutputParser, OpenAIShapes) {
  auto r = OutputParser::parse(
      "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n</tool_call>",
      opts("qwen3", "qwen3_coder", false, kTools));
  auto m = r.to_openai();
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "search");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"query": "x"})");

  OutputDelta d;
  d.tool_calls.push_back({0, "call_x", "search", ""});
  d.tool_calls.push_back({0, "", "", "{\"q"});
  auto j = d.to_openai();
  EXPECT_EQ(j["tool_calls"][0]["id"], "call_x");
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "search");
  EXPECT_FALSE(j["tool_calls"][1].contains("id"));
  EXPECT_EQ(j["tool_calls"][1]["function"]["arguments"], "{\"q");
  EXPECT_FALSE(j.contains("content"));
}

TEST(OutputParser, UnknownParserNamesAreConfigurationErrors) {
  EXPECT_THROW(OutputParser(opts("deepseek", "")), Error);
  EXPECT_THROW(OutputParser(opts("", "mistral")), Error);
}

TEST(OutputParser, ArbitraryBytesNeverThrow) {
  // Random garbage mixed with markers: must not throw, and nothing but inter-call whitespace is dropped.
  std::string pieces[] = {"<tool_call>",
                          "</tool_call>",
                          "<function=f>",
                          "<parameter=a>",
                          "</parameter>",
                          "</function>",
                          "<think>",
                          "</think>",
                          "{\"name\": \"x\"",
                          "}",
                          "\n",
                          " ",
                          "abc",
                          "<",
                          ">"};
  uint64_t seed = 12345;
  for (int round = 0; round < 300; ++round) {
    std::string text;
    for (int k = 0; k < 12; ++k) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      text += pieces[(seed >> 33) % std::size(pieces)];
    }
    for (const char* tools : {"qwen3_coder", "hermes"}) {
      EXPECT_NO_THROW(streamed(text, opts("qwen3", tools, round % 2 == 0, kTools), 1 + round % 5)) << text;
    }
  }
}

}  // namespace
}  // namespace moeserve::text
