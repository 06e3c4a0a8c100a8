// Request parsing and validation: every field of the issue, and the 400s that name the parameter.
#include "server/openai_request.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "engine/json_constraint.h"
#include "server/api_error.h"
#include "server/sampling_defaults.h"

namespace moeserve::server {
namespace {

using json = nlohmann::ordered_json;

// The ApiError a body produces, or a failure when it parses.
template <typename Parse>
ApiError error_of(Parse parse, const std::string& body) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an ApiError for " << body;
  return ApiError(0, "", "");
}

ApiError completion_error(const std::string& body) {
  return error_of(parse_completion_request, body);
}
ApiError chat_error(const std::string& body) {
  return error_of(parse_chat_request, body);
}

TEST(CompletionRequest, ParsesEveryPromptShape) {
  auto r = parse_completion_request(R"({"model":"m","prompt":"hello"})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "hello");
  EXPECT_EQ(r.model, "m");

  r = parse_completion_request(R"({"prompt":[1,2,3]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r.model);

  r = parse_completion_request(R"({"prompt":["a","b"]})");
  EXPECT_EQ(r.prompts.size(), 2u);
  r = parse_completion_request(R"({"prompt":[[1,2],[3]]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[1]), (std::vector<int32_t>{3}));
}

TEST(CompletionRequest, ParsesSamplingAndStreaming) {
  auto r = parse_completion_request(R"({"prompt":"x","n":3,"best_of":3,"max_tokens":7,"temperature":0.5,
      "top_p":0.9,"top_k":40,"min_p":0.05,"presence_penalty":0.5,"frequency_penalty":-0.5,
      "repetition_penalty":1.1,"seed":-3,"stop":["a","bc"],"stop_token_ids":[5],"logprobs":2,"echo":true,
      "stream":true,"stream_options":{"include_usage":true},"user":"u","ignore_eos":true,"min_tokens":2,
      "return_token_ids":true,"store":false,"metadata":{"a":"b"}})");
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 0.9);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_DOUBLE_EQ(r.sampling.min_p, 0.05);
  EXPECT_DOUBLE_EQ(r.sampling.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(r.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{5}));
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.stream.stream);
  EXPECT_TRUE(r.stream.include_usage);
  EXPECT_EQ(r.user, "u");
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.min_tokens, 2);
  EXPECT_TRUE(r.return_token_ids);
}

TEST(CompletionRequest, ExplicitNullMeansDefault) {
  auto r = parse_completion_request(R"({"prompt":"x","temperature":null,"max_tokens":null,"stop":null})");
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 1.0);
  EXPECT_FALSE(r.sampling.max_tokens);
  EXPECT_TRUE(r.sampling.stop.empty());
}

TEST(CompletionRequest, IntegralFloatsAreIntegers) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":"x","max_tokens":4.0})").sampling.max_tokens, 4);
  EXPECT_EQ(completion_error(R"({"prompt":"x","max_tokens":4.5})").param, "max_tokens");
}

TEST(CompletionRequest, InvalidValuesNameTheParameter) {
  struct Case {
    const char* body;
    const char* param;
  };
  for (auto c : std::vector<Case>{
           {R"({"prompt":"x","temperature":2.5})", "temperature"},
           {R"({"prompt":"x","temperature":"hot"})", "temperature"},
           {R"({"prompt":"x","top_p":0})", "top_p"},
           {R"({"prompt":"x","top_p":1.5})", "top_p"},
           {R"({"prompt":"x","top_k":-2})", "top_k"},
           {R"({"prompt":"x","min_p":2})", "min_p"},
           {R"({"prompt":"x","presence_penalty":3})", "presence_penalty"},
           {R"({"prompt":"x","frequency_penalty":-3})", "frequency_penalty"},
           {R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty"},
           {R"({"prompt":"x","n":0})", "n"},
           {R"({"prompt":"x","n":1000})", "n"},
           {R"({"prompt":"x","n":2,"best_of":3})", "best_of"},
           {R"({"prompt":"x","max_tokens":-1})", "max_tokens"},
           {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
           {R"({"prompt":"x","max_tokens":true})", "max_tokens"},
           {R"({"prompt":"x","logprobs":21})", "logprobs"},
           {R"({"prompt":"x","logprobs":true})", "logprobs"},
           {R"({"prompt":"x","stop":5})", "stop"},
           {R"({"prompt":"x","stop":[""]})", "stop"},
           {R"({"prompt":"x","stop_token_ids":[-1]})", "stop_token_ids"},
           {R"({"prompt":"x","seed":"1"})", "seed"},
           {R"({"prompt":"x","stream":"yes"})", "stream"},
           {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
           {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})",
            "stream_options.include_usage"},
           {R"({"prompt":"x","suffix":"y"})", "suffix"},
           {R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
           {R"({"prompt":"x","logit_bias":{"a5":1}})", "logit_bias"},
           {R"({"prompt":"x","logit_bias":{"-5":1}})", "logit_bias"},
           {R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias"},
           {R"({"prompt":"x","logit_bias":{"5":"up"}})", "logit_bias"},
           {R"({"prompt":"x","priority":"high"})", "priority"},
           {R"({"prompt":"x","priority":1.5})", "priority"},
           {R"({"prompt":"x","store":"yes"})", "store"},
           {R"({"prompt":"x","metadata":[]})", "metadata"},
           {R"({"prompt":"x","modalities":["text","audio"]})", "modalities"},
           {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{}}})", "response_format"},
           {R"({"prompt":"x","ebnf":"root ::= \"a\""})", "ebnf"},
           {R"({"prompt":"x","structural_tag":"{}"})", "structural_tag"},
           {R"({"prompt":"x","use_beam_search":true})", "use_beam_search"},
           {R"({"prompt":"x","bad_words":["no"]})", "bad_words"},
           {R"({"prompt":"x","length_penalty":0.5})", "length_penalty"},
           {R"({"prompt":"x","guided_grammar":"root ::= x"})", "guided_grammar"},
           {R"({"prompt":"x","guided_json":{"type":"object","multipleOf":2}})", "guided_json"},
           {R"({"prompt":"x","min_tokens":5,"max_tokens":2})", "min_tokens"},
           {R"({"prompt":"x","model":7})", "model"},
           {R"({"prompt":""})", "prompt"},
           {R"({"prompt":[]})", "prompt"},
           {R"({"prompt":[1,"a"]})", "prompt"},
           {R"({"prompt":[1,-5]})", "prompt"},
           {R"({"prompt":{"a":1}})", "prompt"},
           {R"({"max_tokens":3})", "prompt"},
       }) {
    ApiError e = completion_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    ASSERT_TRUE(e.param) << c.body;
    EXPECT_EQ(*e.param, c.param) << c.body << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
}

TEST(CompletionRequest, BodiesPastTheJsonLimitsAre400sThatSayWhich) {
  // The body's own object is level 1: 127 more levels are accepted, 128 are one too many.
  auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_NO_THROW(parse_completion_request(R"({"prompt":"x","extra":)" + nested(127) + "}"));
  ApiError deep = completion_error(R"({"prompt":"x","extra":)" + nested(128) + "}");
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(std::string(deep.what()).find("deeper than 128 levels"), std::string::npos) << deep.what();
  ApiError deeper = completion_error(R"({"prompt":"x","extra":)" + nested(100'000) + "}");
  EXPECT_LT(std::string(deeper.what()).size(), 300u) << deeper.what();
  // Tool-call arguments sent as a JSON string are held to the same limits.
  ApiError args = chat_error(
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":")" +
      nested(200) + R"("}}]}]})");
  ASSERT_TRUE(args.param);
  EXPECT_EQ(*args.param, "messages[0].tool_calls[0].function.arguments");
  // A value in an error is quoted by at most a few dozen bytes.
  ApiError bias =
      completion_error(R"({"prompt":"x","logit_bias":{"5":")" + std::string(100'000, 'u') + R"("}})");
  EXPECT_LT(std::string(bias.what()).size(), 200u);
}

TEST(CompletionRequest, StopStringsAreBoundedInLength) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":"x","stop":")" + std::string(1024, 's') + R"("})")
                .sampling.stop[0]
                .size(),
            1024u);
  ApiError e = completion_error(R"({"prompt":"x","stop":["a",")" + std::string(1025, 's') + R"("]})");
  ASSERT_TRUE(e.param);
  EXPECT_EQ(*e.param, "stop");
  EXPECT_NE(std::string(e.what()).find("at most 1024 bytes"), std::string::npos) << e.what();
}

TEST(CompletionRequest, ParsesLogitBiasAndPriority) {
  auto r =
      parse_completion_request(R"({"prompt":"x","logit_bias":{"50":-100,"7":2.5,"0":100},"priority":-3})");
  EXPECT_EQ(r.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{0, 100.0f}, {7, 2.5f}, {50, -100.0f}}));
  EXPECT_EQ(r.priority, -3);
  EXPECT_TRUE(parse_completion_request(R"({"prompt":"x","logit_bias":{}})").sampling.logit_bias.empty());
}

// What current OpenAI SDKs, LangChain and vLLM/SGLang clients send: parameters with no effect here are
// accepted (type-checked when known), unknown ones are ignored and named for the log.
TEST(ChatRequest, AcceptsParametersItDoesNotUseAndNamesTheUnknownOnes) {
  auto r = parse_chat_request(R"({"messages":[{"role":"user","content":"x","colour":"red"}],
      "priority":2,"reasoning_effort":"low","parallel_tool_calls":false,"service_tier":"auto","store":true,
      "metadata":{"k":"v"},"prediction":{"type":"content","content":"x"},"modalities":["text"],
      "logit_bias":{"3":-1},"response_format":{"type":"text"},"guided_decoding_backend":"xgrammar",
      "stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false},
      "frobnicate":{"deep":[1]},"top_a":0.1})");
  EXPECT_EQ(r.priority, 2);
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -1.0f}}));
  EXPECT_TRUE(r.stream.include_usage);
  EXPECT_EQ(r.messages[0].size(), 2u) << r.messages[0].dump();  // role and content only
  std::vector<std::string> ignored = r.ignored;
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored, (std::vector<std::string>{"frobnicate", "guided_decoding_backend", "messages[0].colour",
                                               "stream_options.include_obfuscation", "top_a"}));

  auto c = parse_completion_request(R"({"prompt":"x","response_format":{"type":"text"},"best_of":1,"x":1})");
  EXPECT_EQ(c.ignored, std::vector<std::string>{"x"});
}

TEST(ChatRequest, NoOpValuesOfUnsupportedControlsPassAndGivenSamplingIsRecorded) {
  auto r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"use_beam_search":false,
      "length_penalty":1.0,"bad_words":[],"temperature":0.2,"top_k":5})");
  EXPECT_TRUE(r.ignored.empty()) << testing::PrintToString(r.ignored);
  EXPECT_TRUE(r.sampling.given.temperature);
  EXPECT_TRUE(r.sampling.given.top_k);
  EXPECT_FALSE(r.sampling.given.top_p);
  EXPECT_TRUE(r.parallel_tool_calls);
}

TEST(SamplingDefaults, GenerationConfigFillsOnlyWhatTheRequestLeftUnset) {
  auto dir = std::filesystem::temp_directory_path() / ("moeserve-gencfg-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "generation_config.json")
      << R"({"do_sample":true,"temperature":0.6,"top_p":0.95,"top_k":20,
      "eos_token_id":[1,2]})";
  SamplingDefaults d = SamplingDefaults::load(dir.string());
  EXPECT_EQ(d.summary(), "temperature=0.6 top_p=0.95 top_k=20");
  auto r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"temperature":0})");
  d.apply(r.sampling);
  EXPECT_EQ(r.sampling.temperature, 0.0);  // the request's own value wins
  EXPECT_EQ(r.sampling.top_p, 0.95);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_EQ(r.sampling.min_p, 0.0);  // not in the file: the API default
  std::ofstream(dir / "generation_config.json") << R"({"temperature":7})";
  EXPECT_THROW(SamplingDefaults::load(dir.string()), Error);
  EXPECT_TRUE(SamplingDefaults::load((dir / "absent").string()).empty());
  std::filesystem::remove_all(dir);
}

TEST(RequestBody, MalformedJsonIs400WithoutParam) {
  for (const char* body :
       {"", "{", "{\"prompt\": }", "[1,2]", "\"str\"", "null", "{\"a\":1}garbage", "\xff\xfe{}"}) {
    ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_FALSE(e.param) << body;
  }
}

TEST(ChatRequest, ParsesMessagesToolsAndTemplateArguments) {
  auto r = parse_chat_request(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null,"reasoning_content":"hmm",
       "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"x\":1}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"42"}],
    "tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"get"}},
    "logprobs":true,"top_logprobs":3,"max_completion_tokens":9,"max_tokens":100,
    "chat_template_kwargs":{"enable_thinking":false},"parallel_tool_calls":true})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "hi there");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "hmm");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], json({{"x", 1}}));
  EXPECT_EQ(r.messages[3]["tool_call_id"], "call_1");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tool_choice_name, "get");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.sampling.max_tokens, 9);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
}

TEST(ChatRequest, ToolChoiceDefaults) {
  auto r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNone);
  r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
}

// Image parts become {"type": "image"} parts for the chat template, their URLs listed in prompt order with
// the parameter that names them; text-only content stays a string.
TEST(ChatRequest, ImagePartsAreListedInPromptOrder) {
  ChatRequest r = parse_chat_request(R"({"messages":[
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:1"}},
                                {"type":"text","text":"b"},{"type":"text","text":"c"}]},
      {"role":"assistant","content":"ok"},
      {"role":"user","content":[{"type":"image_url","image_url":"http://x/2.png"},{"type":"text","text":"d"}]}]})");
  ASSERT_EQ(r.images.size(), 2u);
  EXPECT_EQ(r.images[0].url, "data:1");
  EXPECT_EQ(r.images[0].param, "messages[0].content[1].image_url");
  EXPECT_EQ(r.images[1].url, "http://x/2.png");
  EXPECT_EQ(r.images[1].param, "messages[2].content[0].image_url");
  EXPECT_EQ(r.messages[0]["content"].dump(),
            R"([{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"bc"}])");
  EXPECT_EQ(r.messages[1]["content"], "ok");
  EXPECT_EQ(r.messages[2]["content"].dump(), R"([{"type":"image"},{"type":"text","text":"d"}])");
  ChatRequest text =
      parse_chat_request(R"({"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]})");
  EXPECT_TRUE(text.images.empty());
  EXPECT_EQ(text.messages[0]["content"], "x");
}

// vLLM's per-request mm_processor_kwargs, on chat and completions alike: min_pixels and max_pixels; any
// other key, a non-object, a non-integer or min over max is a 400 naming it (the server's bounds are the
// service's check: tests/server/serve_vision_test.cpp).
TEST(ChatRequest, MmProcessorKwargsTakeThePixelBoundsOnly) {
  ChatRequest r = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"mm_processor_kwargs":{"min_pixels":4096,"max_pixels":8192}})");
  EXPECT_EQ(r.mm_processor_kwargs.min_pixels, 4096);
  EXPECT_EQ(r.mm_processor_kwargs.max_pixels, 8192);
  EXPECT_TRUE(r.ignored.empty());
  CompletionRequest c =
      parse_completion_request(R"({"prompt":"x","mm_processor_kwargs":{"max_pixels":8192}})");
  EXPECT_FALSE(c.mm_processor_kwargs.min_pixels);
  EXPECT_EQ(c.mm_processor_kwargs.max_pixels, 8192);
  for (auto [kwargs, param] : std::vector<std::pair<std::string, std::string>>{
           {"5", "mm_processor_kwargs"},
           {R"({"fps":2})", "mm_processor_kwargs.fps"},
           {R"({"max_pixels":"a lot"})", "mm_processor_kwargs.max_pixels"},
           {R"({"min_pixels":0})", "mm_processor_kwargs.min_pixels"},
           {R"({"min_pixels":9000,"max_pixels":8000})", "mm_processor_kwargs"}}) {
    try {
      parse_completion_request(R"({"prompt":"x","mm_processor_kwargs":)" + kwargs + "}");
      ADD_FAILURE() << kwargs << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << kwargs << ": " << e.what();
    }
  }
}

TEST(ChatRequest, InvalidValuesNameTheParameter) {
  struct Case {
    const char* body;
    const char* param;
  };
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  for (
      auto c : std::vector<Case>{
          {R"({})", "messages"},
          {R"({"messages":[]})", "messages"},
          {R"({"messages":"hi"})", "messages"},
          {R"({"messages":[5]})", "messages[0]"},
          {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
          {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
          {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
          {R"({"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x"}}]}]})",
           "messages[0].content[0].type"},
          {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"detail":"low"}}]}]})",
           "messages[0].content[0].image_url"},
          {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls"},
          {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}]})",
           "messages[0].tool_calls[0].function.arguments"},
          {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
          {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
           "tools[0].function"},
          {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]})", "tools[0].type"},
          {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes",
               "tools":[{"type":"function","function":{"name":"f"}}]})",
           "tool_choice"},
          {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
          {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}},
               "tools":[{"type":"function","function":{"name":"f"}}]})",
           "tool_choice"},
          {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
          {R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs"},
          {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})",
           "chat_template_kwargs"},
          {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
           "response_format"},
          {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
               "json_schema":{"name":"p","schema":{"type":"string","pattern":"(?=a)b"}}}})",
           "response_format"},
          {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
               "json_schema":{"schema":{"type":"string"}}}})",
           "response_format"},
          {R"({"messages":[{"role":"user","content":"x"}],"functions":[]})", "functions"},
          {R"({"messages":[{"role":"user","content":"x"}],"guided_grammar":"root ::= x"})", "guided_grammar"},
          {R"({"messages":[{"role":"user","content":"x"}],"guided_choice":["a",1]})", "guided_choice"},
          {R"({"messages":[{"role":"user","content":"x"}],"regex":"(a"})", "regex"},
          {R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{"grammar":"x"}})",
           "structured_outputs"},
          {R"({"messages":[{"role":"user","content":"x"}],"guided_regex":"a","guided_choice":["a"]})",
           "guided_regex"},
          {R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"no"})",
           "parallel_tool_calls"},
          {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":3})", "reasoning_effort"},
          {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_tokens"},
          {R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})",
           "continue_final_message"},
      }) {
    ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    ASSERT_TRUE(e.param) << c.body << ": " << e.what();
    EXPECT_EQ(*e.param, c.param) << c.body << ": " << e.what();
  }
}

TEST(ChatRequest, ParsesResponseFormat) {
  const std::string head = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(parse_chat_request(head + R"("response_format":{"type":"text"}})").response_format.schema,
            nullptr);
  auto object = parse_chat_request(head + R"("response_format":{"type":"json_object"}})").response_format;
  EXPECT_EQ(object.type, ResponseFormat::Type::kJsonObject);
  EXPECT_NE(object.schema, nullptr);
  auto schema = parse_chat_request(head + R"("response_format":{"type":"json_schema","json_schema":
      {"name":"person","strict":true,"schema":{"type":"object","properties":{"age":{"type":"integer"}}}}}})")
                    .response_format;
  EXPECT_EQ(schema.type, ResponseFormat::Type::kJsonSchema);
  EXPECT_EQ(schema.name, "person");
  EXPECT_NE(schema.schema, nullptr);
  auto completion = parse_completion_request(R"({"prompt":"x","response_format":{"type":"json_object"}})");
  EXPECT_NE(completion.response_format.schema, nullptr);
  // An unsupported keyword is named in the 400, with where it is.
  ApiError e = chat_error(head + R"("response_format":{"type":"json_schema","json_schema":{"name":"p",
      "schema":{"type":"object","properties":{"when":{"type":"string","format":"hostname"}}}}}})");
  EXPECT_EQ(*e.param, "response_format");
  EXPECT_NE(std::string(e.what()).find("'format'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("properties.when"), std::string::npos) << e.what();
}

TEST(ChatRequest, ParsesVllmAndSglangStructuredOutputs) {
  const std::string head = R"({"messages":[{"role":"user","content":"x"}],)";
  auto matches = [](const ResponseFormat& f, const std::string& text) {
    JsonMatcher m(f.schema);
    return m.advance(text) && m.can_end();
  };
  auto so =
      parse_chat_request(head + R"("structured_outputs":{"regex":"[0-9]{3}","json":null}})").response_format;
  EXPECT_EQ(so.type, ResponseFormat::Type::kRegex);
  EXPECT_TRUE(matches(so, "123"));
  EXPECT_FALSE(matches(so, "12"));
  auto choice = parse_chat_request(head + R"("guided_choice":["yes","no"]})").response_format;
  EXPECT_TRUE(matches(choice, "no"));
  EXPECT_FALSE(matches(choice, "n"));
  auto sglang = parse_chat_request(head + R"("regex":"(yes|no)!"})").response_format;
  EXPECT_TRUE(matches(sglang, "yes!"));
  auto json_string = parse_chat_request(head + R"("guided_json":"{\"type\": \"integer\", \"minimum\": 1}"})");
  EXPECT_TRUE(matches(json_string.response_format, "7"));
  EXPECT_FALSE(matches(json_string.response_format, "0"));
  auto object = parse_chat_request(head + R"("structured_outputs":{"json_object":true}})").response_format;
  EXPECT_EQ(object.type, ResponseFormat::Type::kJsonObject);
  // zod's z.number().int() bounds, once a 400.
  auto zod = parse_chat_request(head + R"("response_format":{"type":"json_schema","json_schema":{"name":"n",
      "schema":{"type":"object","properties":{"n":{"type":"integer","minimum":-9007199254740991,
      "maximum":9007199254740991}},"required":["n"],"additionalProperties":false}}}})")
                 .response_format;
  EXPECT_TRUE(matches(zod, R"({"n": 42})"));
}

TEST(ApiErrorJson, HasTheOpenAiShape) {
  ApiError e = invalid_param("temperature", "must be in [0, 2], got {}", 3);
  json j = json::parse(error_json(e));
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["code"], 400);
  EXPECT_EQ(j["error"]["message"], "'temperature': must be in [0, 2], got 3");
  HttpResponse r = error_response(429, "busy");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(json::parse(r.body)["error"]["param"].is_null());
}

}  // namespace
}  // namespace moeserve::server
