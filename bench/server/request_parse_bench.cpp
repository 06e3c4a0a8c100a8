// The cost of reading a request body, before and after the parse went through parse_bounded_json: nlohmann's
// own ordered_json parse against the bounded one, and the whole parse_chat_request, on the bodies the four
// workloads send (one turn; ten turns with tools; an 8K-token prompt) and on a wide object (the case the old
// parse made quadratic).
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/bounded_json.h"
#include "server/openai_request.h"

namespace moeserve::server {
namespace {

using ordered_json = nlohmann::ordered_json;

const char* kTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Current weather for a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string",)"
    R"("enum":["celsius","fahrenheit"]}},"required":["city"]}}})";

std::string body(int turns, size_t words_per_turn, bool tools) {
  ordered_json messages = ordered_json::array();
  std::string text;
  for (size_t w = 0; w < words_per_turn; ++w) text += "word" + std::to_string(w % 97) + " ";
  for (int t = 0; t < turns; ++t) {
    messages.push_back({{"role", t % 2 ? "assistant" : "user"}, {"content", text}});
  }
  ordered_json b = {{"model", "qwen"}, {"messages", messages}, {"max_tokens", 128}, {"temperature", 0.7}};
  if (tools) {
    ordered_json other = ordered_json::parse(kTool);
    other["function"]["name"] = "get_forecast";
    b["tools"] = ordered_json::array({ordered_json::parse(kTool), other});
  }
  return b.dump();
}

std::string wide(size_t keys) {
  std::string s = R"({"model":"qwen","messages":[{"role":"user","content":"hi"}],"metadata":{)";
  for (size_t i = 0; i < keys; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return s + "}}";
}

const std::string& case_body(int64_t which) {
  static const std::string single = body(1, 60, false);
  static const std::string dialogue = body(10, 60, true);
  static const std::string long_prompt = body(1, 8192, false);
  static const std::string many_keys = wide(20000);
  switch (which) {
    case 0:
      return single;
    case 1:
      return dialogue;
    case 2:
      return long_prompt;
    default:
      return many_keys;
  }
}

const char* kCaseNames[] = {"single_turn", "10_turns_tools", "8k_prompt", "20k_keys"};

void BM_NlohmannOrderedParse(benchmark::State& state) {
  const std::string& b = case_body(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(ordered_json::parse(b));
  state.SetBytesProcessed(int64_t(b.size()) * state.iterations());
  state.SetLabel(kCaseNames[state.range(0)]);
}

void BM_BoundedParse(benchmark::State& state) {
  const std::string& b = case_body(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(parse_bounded_json<ordered_json>(b));
  state.SetBytesProcessed(int64_t(b.size()) * state.iterations());
  state.SetLabel(kCaseNames[state.range(0)]);
}

void BM_ParseChatRequest(benchmark::State& state) {
  const std::string& b = case_body(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(parse_chat_request(b));
  state.SetBytesProcessed(int64_t(b.size()) * state.iterations());
  state.SetLabel(kCaseNames[state.range(0)]);
}

BENCHMARK(BM_NlohmannOrderedParse)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BoundedParse)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ParseChatRequest)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moeserve::server

BENCHMARK_MAIN();
