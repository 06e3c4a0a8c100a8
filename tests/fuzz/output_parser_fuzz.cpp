// The output parsers on model output, which is untrusted (a prompt can make a model write anything): nothing
// throws; streaming the text in pieces gives what parsing it whole gives (OutputParser::parse promises
// push + finish), and the deltas add up to the result; valid UTF-8 in (what the detokenizer gives) gives
// tool calls whose arguments are a JSON object and messages that serialise. The first byte picks the parsers
// (bits 0-1: none, qwen3_coder, hermes; bit 2 the qwen3 reasoning parser; bit 3 the prompt opened <think>),
// the second how the text is cut into pieces, the rest is the text.
#include <random>
#include <string>
#include <vector>

#include "common/bounded_json.h"
#include "fuzz_target.h"
#include "text/output_parser.h"

namespace moeserve::fuzz {

namespace {

using nlohmann::ordered_json;

// A tool whose parameters cover the types qwen3_coder converts values to.
const ordered_json& tools() {
  static const ordered_json t = ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"},
        "metric": {"type": "boolean"}, "units": {"enum": ["c", "f"]}, "where": {"type": "object"},
        "hours": {"type": "array", "items": {"type": "integer"}}, "note": {"type": ["string", "null"]}}}}}])");
  return t;
}

// Pieces of 1 to 16 bytes; with valid UTF-8 only at character boundaries, as the detokenizer emits text.
std::vector<std::string_view> pieces(std::string_view text, unsigned seed, bool utf8) {
  std::minstd_rand rng(seed + 1);
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + 1 + rng() % 16);
    while (utf8 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    out.push_back(text.substr(at, end - at));
    at = end;
  }
  return out;
}

void check_same(const text::ParsedOutput& streamed, const text::ParsedOutput& whole) {
  FUZZ_CHECK(streamed.reasoning_content == whole.reasoning_content, "streamed reasoning differs from whole");
  FUZZ_CHECK(streamed.content == whole.content, "streamed content differs from whole");
  FUZZ_CHECK(streamed.tool_calls.size() == whole.tool_calls.size(), "{} tool calls streamed, {} whole",
             streamed.tool_calls.size(), whole.tool_calls.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    FUZZ_CHECK(streamed.tool_calls[i].name == whole.tool_calls[i].name, "tool call {}: another name", i);
    FUZZ_CHECK(streamed.tool_calls[i].arguments == whole.tool_calls[i].arguments,
               "tool call {}: other arguments", i);
  }
}

}  // namespace

Verdict fuzz_output_parser(std::string_view data) {
  if (data.size() < 2) return Verdict::kRefused;
  const auto flags = static_cast<unsigned char>(data[0]);
  const auto cut = static_cast<unsigned char>(data[1]);
  const std::string_view text = data.substr(2);
  text::OutputParserOptions options;
  static const char* const kToolParsers[] = {"", "qwen3_coder", "hermes", "hermes"};
  options.tool_parser = kToolParsers[flags & 3];
  options.reasoning_parser = flags & 4 ? "qwen3" : "";
  options.starts_in_reasoning = flags & 8;
  options.tools = tools();

  const bool utf8 = is_valid_utf8(text);
  text::OutputParser parser(options);
  std::string reasoning, content;
  std::vector<text::ToolCallDelta>
      calls;  // per index: id and name from the first piece, arguments concatenated
  auto take = [&](const text::OutputDelta& d) {
    reasoning += d.reasoning_content;
    content += d.content;
    for (const auto& piece : d.tool_calls) {
      FUZZ_CHECK(piece.index >= 0 && size_t(piece.index) <= calls.size(), "a delta for tool call {} of {}",
                 piece.index, calls.size());
      if (size_t(piece.index) == calls.size()) {
        FUZZ_CHECK(!piece.id.empty(), "a tool call's first delta has no id");
        calls.push_back(piece);
      } else {
        calls[size_t(piece.index)].arguments += piece.arguments;
      }
    }
    if (utf8) (void)d.to_openai().dump();
  };
  for (std::string_view piece : pieces(text, cut, utf8)) take(parser.push(piece));
  take(parser.finish());

  const text::ParsedOutput& result = parser.result();
  check_same(result, text::OutputParser::parse(text, options));
  FUZZ_CHECK(reasoning == result.reasoning_content && content == result.content,
             "the deltas do not add up to the message");
  FUZZ_CHECK(calls.size() == result.tool_calls.size(), "{} tool calls in deltas, {} in the message",
             calls.size(), result.tool_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const text::ToolCall& call = result.tool_calls[i];
    FUZZ_CHECK(calls[i].name == call.name && calls[i].id == call.id && calls[i].arguments == call.arguments,
               "tool call {}'s deltas do not add up to it", i);
    // The detokenizer hands the parser valid UTF-8 only; other bytes may end up in arguments as they are.
    if (utf8)
      FUZZ_CHECK(parse_bounded_json_or_discarded<ordered_json>(call.arguments).is_object(),
                 "tool call {}'s arguments are not a JSON object", i);
  }
  if (utf8) (void)result.to_openai().dump();
  return result.tool_calls.empty() ? Verdict::kRefused : Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
