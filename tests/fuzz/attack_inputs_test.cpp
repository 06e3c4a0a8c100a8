// The attack classes of issue 15 at full size, generated here rather than stored (each is hundreds of KB to
// a few MB): nesting a hundred thousand levels deep in every field that takes JSON, objects of 200,000
// members, an enum of 200,000 values, tool-call arguments whose string holds deeply nested JSON. Each goes
// through the fuzz targets, so it must keep their promises (no crash, a short 400 or a clean error); nesting
// that deep is refused outright.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace moeserve::fuzz {
namespace {

constexpr size_t kDeep = 100'000;
constexpr size_t kWide = 200'000;

std::string deep_arrays(size_t depth = kDeep) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string deep_objects(size_t depth = kDeep) {
  std::string s;
  s.reserve(depth * 6 + 1);
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += '1';
  return s + std::string(depth, '}');
}

// A schema of arrays of arrays ...: valid JSON Schema at every level.
std::string deep_schema(size_t depth = kDeep) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += R"({"type":"array","items":)";
  s += R"({"type":"string"})";
  return s + std::string(depth, '}');
}

// {"<prefix>0": 0, "<prefix>1": 0, ...}; with an empty prefix the keys are token ids (logit_bias).
std::string wide_object(const std::string& prefix = "k", size_t members = kWide) {
  std::string s = "{";
  for (size_t i = 0; i < members; ++i) s += (i ? ",\"" : "\"") + prefix + std::to_string(i) + "\":0";
  return s + "}";
}

std::string huge_enum(size_t values = kWide) {
  std::string s = R"({"type":"string","enum":[)";
  for (size_t i = 0; i < values; ++i) s += (i ? ",\"v" : "\"v") + std::to_string(i) + "\"";
  return s + "]}";
}

// JSON text as a JSON string.
std::string quoted(const std::string& text) {
  std::string s = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') s += '\\';
    s += c;
  }
  return s + "\"";
}

// Chat and completion bodies with `value` in one field each.
std::vector<std::string> request_bodies(const std::string& value) {
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  const std::string schema_format = R"({"type":"json_schema","json_schema":{"name":"n","schema":)";
  const std::string tool_call =
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",)"
      R"("function":{"name":"f","arguments":)";
  return {
      value,
      R"({"messages":[{"role":"user","content":)" + value + "}]}",
      R"({"messages":[{"role":"user","content":"hi","extra":)" + value + "}]}",
      "{" + user + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + value + "}}]}",
      "{" + user + R"(,"tool_choice":)" + value + "}",
      "{" + user + R"(,"logit_bias":{"1":)" + value + "}}",
      "{" + user + R"(,"chat_template_kwargs":{"k":)" + value + "}}",
      "{" + user + R"(,"response_format":)" + schema_format + value + "}}}",
      "{" + user + R"(,"stop":)" + value + "}",
      "{" + user + R"(,"metadata":{"k":)" + value + "}}",
      "{" + user + R"(,"unknown":)" + value + "}",
      tool_call + value + "}}]}]}",
      tool_call + quoted(value) + "}}]}]}",
      R"({"prompt":)" + value + "}",
      R"({"prompt":"hi","max_tokens":)" + value + "}",
  };
}

void expect_refused(Verdict (*target)(std::string_view), const std::string& input, const std::string& what) {
  try {
    EXPECT_EQ(target(input), Verdict::kRefused) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
}

void expect_kept_promises(Verdict (*target)(std::string_view), const std::string& input,
                          const std::string& what) {
  try {
    target(input);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
}

TEST(FuzzAttacks, RequestsNestedAHundredThousandLevelsInAnyFieldAreRefused) {
  for (const std::string& value : {deep_arrays(), deep_objects(), deep_schema()}) {
    const auto bodies = request_bodies(value);
    for (size_t i = 0; i < bodies.size(); ++i)
      expect_refused(fuzz_openai_request, bodies[i], "request body " + std::to_string(i));
  }
}

TEST(FuzzAttacks, RequestsWithObjectsOfManyMembersOrHugeEnumsKeepThePromises) {
  for (const std::string& value : {wide_object(), wide_object(""), huge_enum()}) {
    const auto bodies = request_bodies(value);
    for (size_t i = 0; i < bodies.size(); ++i)
      expect_kept_promises(fuzz_openai_request, bodies[i], "request body " + std::to_string(i));
  }
  std::string wide_body = wide_object();
  wide_body.back() = ',';
  wide_body += R"("messages":[{"role":"user","content":"hi"}],"prompt":"hi"})";
  expect_kept_promises(fuzz_openai_request, wide_body, "a request of 200,000 parameters");
}

TEST(FuzzAttacks, SchemasNestedDeepOrWithHugeEnumsOrManyPropertiesKeepThePromises) {
  expect_refused(fuzz_json_schema, deep_schema(), "a schema nested 100,000 levels");
  expect_kept_promises(fuzz_json_schema, huge_enum() + std::string(1, '\0') + "\"v1", "a huge enum");
  expect_kept_promises(fuzz_json_schema, R"({"type":"object","properties":)" + wide_object() + "}",
                       "200,000 properties");
}

TEST(FuzzAttacks, RouterReadsDeeplyNestedAndWideBodiesWithoutThrowing) {
  for (const std::string& value : {deep_arrays(), deep_objects(), wide_object()}) {
    const std::vector<std::string> bodies = {
        value,
        R"({"messages":[{"role":"user","content":)" + value + "}]}",
        R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":)" + value + "}]}]}",
        R"({"model":"m","prompt":)" + value + "}",
        R"({"model":)" + value + "}",
    };
    for (const auto& body : bodies)
      expect_kept_promises(fuzz_router_request, '\x07' + body,
                           "a body of " + std::to_string(body.size()) + " bytes");
  }
}

TEST(FuzzAttacks, BoundedJsonRefusesDeepWideAndLongDocumentsAndParsesThoseAtTheLimits) {
  expect_refused(fuzz_bounded_json, deep_arrays(), "arrays nested 100,000 deep");
  expect_refused(fuzz_bounded_json, deep_objects(), "objects nested 100,000 deep");
  expect_refused(fuzz_bounded_json, wide_object(), "an object of 200,000 members");
  std::string long_array = "[";
  for (size_t i = 0; i < (size_t{1} << 21); ++i) long_array += i ? ",0" : "0";
  expect_refused(fuzz_bounded_json, long_array + "]", "an array of 2M items");
  // At the default limits (128 levels, 65,536 members): parsed, and equal to nlohmann's parse.
  try {
    EXPECT_EQ(fuzz_bounded_json(deep_arrays(128)), Verdict::kAccepted);
    EXPECT_EQ(fuzz_bounded_json(wide_object("k", 65'536)), Verdict::kAccepted);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

TEST(FuzzAttacks, TokenizerEncodesLongRunsOfOneCharacterClass) {
  for (const char* unit : {"a", "7", " ", "\n", "\xE4\xB8\xAD", "<|im_end|>", "\xFF"})
    expect_kept_promises(
        fuzz_tokenizer,
        std::string(1, '\0') +
            [&] {
              std::string s;
              while (s.size() < 256 * 1024) s += unit;
              return s;
            }(),
        std::string("a long run of ") + unit);
}

TEST(FuzzAttacks, ModelConfigsNestedDeepInAnyFieldLoadOrFailCleanly) {
  // A config that loads but for the one field: the fixture's, with that field's value swapped.
  auto config_with = [](const char* field, const std::string& value) {
    auto config = nlohmann::json::parse(std::ifstream("tests/fixtures/models/tiny-moe/config.json"));
    config[field] = "@";
    std::string text = config.dump();
    return text.replace(text.find("\"@\""), 3, value);
  };
  for (const std::string& value : {deep_arrays(), deep_objects()}) {
    expect_refused(fuzz_model_config, value, "a config nested 100,000 deep");
    for (const char* field :
         {"layer_types", "eos_token_id", "quantization_config", "rope_parameters", "text_config", "unknown"})
      expect_kept_promises(fuzz_model_config, config_with(field, value), std::string(field) + " nested deep");
  }
}

}  // namespace
}  // namespace moeserve::fuzz
