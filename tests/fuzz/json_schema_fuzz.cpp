// The structured-output compiler and matcher. The input is a JSON schema, then a NUL byte, then bytes a model
// might generate. The schema compiles or is a SchemaError with a short message; the bytes are fed one at a
// time, and the matcher must agree with itself (accepts() says what advance() then does), never reach a dead
// end (some byte or the end of the document stays possible), and only end on text that is JSON.
#include <string>

#include "common/bounded_json.h"
#include "engine/json_constraint.h"
#include "fuzz_target.h"

namespace moeserve::fuzz {

namespace {

bool live(const JsonMatcher& m) {
  if (m.can_end()) return true;
  for (int c = 0; c < 256; ++c)
    if (m.accepts(std::string(1, char(c)))) return true;
  return false;
}

// JSON as RFC 8259 has it: numbers of any size (nlohmann refuses those past a double, like 1e400, which the
// matcher rightly admits; Python reads them as inf).
bool is_json(const std::string& text) {
  try {
    return !nlohmann::json::parse(text).is_discarded();  // parsed: never discarded
  } catch (const nlohmann::json::out_of_range& e) {
    return e.id == 406;  // number overflow
  } catch (const nlohmann::json::parse_error&) {
    return false;
  }
}

}  // namespace

Verdict fuzz_json_schema(std::string_view data) {
  const size_t split = data.find('\0');
  const std::string_view schema_text = data.substr(0, split);
  const std::string_view output =
      split == std::string_view::npos ? std::string_view() : data.substr(split + 1);

  // As the server gets it: a field of a request body, parsed with the request limits.
  nlohmann::json schema;
  try {
    schema = parse_bounded_json<nlohmann::json>(schema_text);
  } catch (const JsonParseError&) {
    return Verdict::kRefused;
  }
  // Small limits first, which inputs of a few bytes reach: exceeding one is a SchemaError like any other.
  JsonSchemaLimits small;
  small.max_depth = 3;
  small.max_properties = 3;
  small.max_enum_values = 3;
  small.max_literal_bytes = 16;
  small.max_nodes = 8;
  try {
    (void)JsonSchema::compile(schema, small);
  } catch (const SchemaError& e) {
    check_error_message(e.what());
  }
  std::shared_ptr<const JsonSchema> compiled;
  try {
    compiled = JsonSchema::compile(schema);
  } catch (const SchemaError& e) {
    check_error_message(e.what());
    return Verdict::kRefused;
  }

  JsonMatcher matcher(compiled);
  std::string text;
  for (char c : output) {
    const std::string byte(1, c);
    const bool accepted = matcher.accepts(byte);
    FUZZ_CHECK(matcher.advance(byte) == accepted, "advance() disagrees with accepts() after {} bytes",
               text.size());
    if (accepted)
      text += c;  // else a sampler would try another token: the rest of the input goes on from here
  }
  // Where the input stops is the fuzzer's choice, so checking there (not after every byte, 256 tries each)
  // covers every prefix over a run.
  FUZZ_CHECK(live(matcher), "a dead end after {} bytes", text.size());
  if (matcher.can_end())
    FUZZ_CHECK(is_json(text), "can_end() on text that is not JSON ({} bytes)", text.size());
  return Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
