#include "loadgen/scenario.h"

#include "common/error.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

constexpr std::string_view kCities[] = {"Paris", "Tokyo", "Nairobi", "Lima",
                                        "Oslo",  "Hanoi", "Denver",  "Perth"};

const json& tools() {
  static const json kTools = json::parse(R"([
    {"type": "function", "function": {
      "name": "get_weather",
      "description": "Current weather for a city.",
      "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {
      "name": "search_web",
      "description": "Search the web and return the top results.",
      "parameters": {"type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"]}}}
  ])");
  return kTools;
}

// A deterministic tool result, so the prompt of the final turn is the same from run to run.
std::string tool_result(const ToolCall& call, std::string_view city) {
  if (call.name == "search_web")
    return json{{"results", {{{"title", "Weather report"}, {"snippet", "Mild and sunny all week."}}}}}.dump();
  return json{{"city", city}, {"temperature", 21}, {"unit", "celsius"}, {"condition", "sunny"}}.dump();
}

}  // namespace

std::string_view scenario_name(Scenario s) {
  switch (s) {
    case Scenario::single_turn:
      return "single_turn";
    case Scenario::multi_turn:
      return "multi_turn";
    case Scenario::tool_call:
      return "tool_call";
    case Scenario::long_gen:
      return "long_gen";
    case Scenario::image:
      return "image";
  }
  return "?";
}

std::vector<Scenario> all_scenarios() {
  return {Scenario::single_turn, Scenario::multi_turn, Scenario::tool_call, Scenario::long_gen};
}

Scenario parse_scenario(std::string_view name) {
  for (Scenario s : all_scenarios())
    if (scenario_name(s) == name) return s;
  if (name == scenario_name(Scenario::image)) return Scenario::image;
  fail("unknown scenario '{}': use single_turn, multi_turn, tool_call, long_gen, image or all", name);
}

size_t requests_per_conversation(const WorkloadOptions& options) {
  switch (options.scenario) {
    case Scenario::multi_turn:
      return std::max<size_t>(options.turns, 1);
    case Scenario::tool_call:
      return 2;
    default:
      return 1;
  }
}

Conversation::Conversation(WorkloadOptions options, const PromptGenerator& prompts, size_t index)
    : options_(std::move(options)),
      prompts_(prompts),
      index_(index),
      turns_(requests_per_conversation(options_)) {}

json Conversation::body(size_t max_tokens, bool exact_length) const {
  json b = {{"model", options_.model},  {"messages", messages_},
            {"stream", true},           {"stream_options", {{"include_usage", true}}},
            {"max_tokens", max_tokens}, {"temperature", options_.temperature}};
  if (exact_length && options_.ignore_eos) {
    b["ignore_eos"] = true;
    b["min_tokens"] = max_tokens;
  }
  if (options_.scenario == Scenario::tool_call) {
    b["tools"] = tools();
    b["tool_choice"] = options_.tool_choice;
  }
  for (auto& [key, value] : options_.extra_body.items()) b[key] = value;
  return b;
}

TurnRequest Conversation::next() {
  TurnRequest request;
  request.turn = turn_;
  // Each (dialogue, turn) pair reads its own stream of the generator: no two prompts share a prefix.
  uint64_t stream = ((options_.prompt_set * 8 + static_cast<uint64_t>(options_.scenario)) << 40) +
                    static_cast<uint64_t>(index_) * 1024 + turn_;
  bool exact_length = true;
  size_t max_tokens = options_.output_len;
  if (options_.scenario == Scenario::tool_call && turn_ == 0) {
    std::string city(kCities[index_ % std::size(kCities)]);
    std::string question = "What is the weather in " + city + " right now? Use the get_weather tool.";
    size_t question_tokens = prompts_.count(question) + 1;
    size_t filler = options_.input_len > question_tokens ? options_.input_len - question_tokens : 0;
    std::string content = prompts_.text(filler, stream) + "\n" + question;
    request.expected_input_tokens = prompts_.count(content);
    messages_.push_back({{"role", "user"}, {"content", std::move(content)}});
    exact_length = false;  // the model ends its tool call itself; ignore_eos would run past it
  } else if (options_.scenario == Scenario::image) {
    // The pictures first, then the question (as people ask about an image).
    json content = json::array();
    for (size_t i = 0; i < options_.images_per_request; ++i) {
      const size_t picture = index_ * options_.images_per_request + i;
      std::string url =
          options_.images ? options_.images->url(picture) : ImageSet(options_.image, stream, 0).url(i);
      content.push_back({{"type", "image_url"}, {"image_url", {{"url", std::move(url)}}}});
    }
    content.push_back({{"type", "text"}, {"text", prompts_.text(options_.input_len, stream)}});
    messages_.push_back({{"role", "user"}, {"content", std::move(content)}});
    request.expected_input_tokens = options_.input_len;
    request.images = options_.images_per_request;
  } else if (options_.scenario != Scenario::tool_call) {
    if (options_.scenario == Scenario::long_gen) max_tokens = options_.long_output_len;
    messages_.push_back({{"role", "user"}, {"content", prompts_.text(options_.input_len, stream)}});
    request.expected_input_tokens = options_.input_len;
  }
  request.expected_output_tokens = max_tokens;
  request.exact_output = exact_length && options_.ignore_eos;
  request.body = body(max_tokens, exact_length).dump();
  return request;
}

void Conversation::complete(const Reply& reply) {
  ++turn_;
  if (options_.scenario != Scenario::tool_call || turn_ != 1) {
    messages_.push_back({{"role", "assistant"}, {"content", reply.content}});
    return;
  }
  // The answer to the tool-call turn: keep the calls the model made (or stand one in), then answer each.
  std::string city(kCities[index_ % std::size(kCities)]);
  std::vector<ToolCall> calls = reply.tool_calls;
  tool_call_returned_ = !calls.empty();
  if (calls.empty()) calls.push_back({"", "get_weather", json{{"city", city}}.dump()});
  json assistant = {{"role", "assistant"}, {"content", reply.content.empty() ? json() : json(reply.content)}};
  json call_list = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].id.empty()) calls[i].id = "call_bench_" + std::to_string(index_) + "_" + std::to_string(i);
    call_list.push_back({{"id", calls[i].id},
                         {"type", "function"},
                         {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  assistant["tool_calls"] = std::move(call_list);
  messages_.push_back(std::move(assistant));
  for (const ToolCall& call : calls)
    messages_.push_back({{"role", "tool"}, {"tool_call_id", call.id}, {"content", tool_result(call, city)}});
}

}  // namespace moeserve::loadgen
