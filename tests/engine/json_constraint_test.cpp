#include "engine/json_constraint.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace moeserve {
namespace {

using json = nlohmann::json;

// How far the matcher follows `text` byte by byte: the bytes accepted, and whether it may end there.
struct Run {
  size_t accepted = 0;
  bool can_end = false;
};

Run run(const std::shared_ptr<const JsonSchema>& schema, std::string_view text) {
  JsonMatcher m(schema);
  Run r;
  for (char c : text) {
    if (!m.accepts(std::string_view(&c, 1))) break;
    EXPECT_TRUE(m.advance(std::string_view(&c, 1)));
    ++r.accepted;
  }
  r.can_end = m.can_end();
  return r;
}

bool valid(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  Run r = run(s, text);
  return r.accepted == text.size() && r.can_end;
}

// The whole text is a valid prefix, but not yet a document.
bool prefix_only(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  Run r = run(s, text);
  return r.accepted == text.size() && !r.can_end;
}

// Rejected exactly at byte `at`.
size_t rejected_at(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  return run(s, text).accepted;
}

std::shared_ptr<const JsonSchema> schema(const char* text) {
  return JsonSchema::compile(json::parse(text));
}

TEST(JsonObject, AcceptsObjectsOfAnything) {
  auto s = JsonSchema::any_object();
  EXPECT_TRUE(valid(s, "{}"));
  EXPECT_TRUE(valid(s, R"( {"a": [1, -0.5e+10, 2E-3, 0, true, false, null, "x"], "b": {"c": {}}} )"));
  EXPECT_TRUE(valid(s, "{\"k\":\"tab\\t quote\\\" slash\\/ \\u00e9 \\ud83d\\ude00\"}"));
  EXPECT_TRUE(valid(s, "{\"utf8\": \"h\xC3\xA9llo \xF0\x9F\x98\x80\"}"));
  EXPECT_TRUE(prefix_only(s, "{\"a\": [1, 2"));
  EXPECT_TRUE(prefix_only(s, "{\"a\""));
}

TEST(JsonObject, RejectsWhatIsNotJsonAtTheFirstBadByte) {
  auto s = JsonSchema::any_object();
  EXPECT_EQ(rejected_at(s, "[1]"), 0u);          // top level must be an object
  EXPECT_EQ(rejected_at(s, "{'a': 1}"), 1u);     // single quotes
  EXPECT_EQ(rejected_at(s, "{\"a\" 1}"), 5u);    // no colon
  EXPECT_EQ(rejected_at(s, "{\"a\": 01}"), 7u);  // leading zero
  EXPECT_EQ(rejected_at(s, "{\"a\": -}"), 7u);
  EXPECT_EQ(rejected_at(s, "{\"a\": 1.}"), 8u);
  EXPECT_EQ(rejected_at(s, "{\"a\": 1e}"), 8u);
  EXPECT_EQ(rejected_at(s, "{\"a\": .5}"), 6u);
  EXPECT_EQ(rejected_at(s, "{\"a\": tru }"), 9u);
  EXPECT_EQ(rejected_at(s, "{\"a\": 1,}"), 8u);  // trailing comma
  EXPECT_EQ(rejected_at(s, "{\"a\": [1,]}"), 9u);
  EXPECT_EQ(rejected_at(s, "{\"a\": [,1]}"), 7u);  // no comma before the first item
  EXPECT_EQ(rejected_at(s, "{\"a\": [ , 1]}"), 8u);
  EXPECT_EQ(rejected_at(s, "{,}"), 1u);
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\\x\"}"), 8u);  // bad escape
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\\u12g4\"}"), 11u);
  EXPECT_EQ(rejected_at(s, "{\"a\": \"x\ny\"}"), 8u);  // raw control character in a string
  EXPECT_EQ(rejected_at(s, "{} {}"), 3u);              // one value only
  EXPECT_EQ(rejected_at(s, "{\"a\": 1}}"), 8u);
}

// Differential: random edits of valid documents, judged by the matcher and by nlohmann's parser, agree on
// every one (both ways), and whatever the matcher takes byte by byte is a prefix it can still complete.
TEST(JsonObject, AgreesWithAParserOnRandomEdits) {
  auto s = JsonSchema::any_object();
  const std::vector<std::string> seeds = {
      R"({"a": [1, -0.5e+10, {"b": null}], "c": "x\"y\u00e9", "d": true})", R"({})",
      R"({"k": [[], [{}], 0, 1E5, -0, 12.25e-3], "s": "\ud83d\ude00 \/ \n"})", R"( {"x" : false , "y":""} )"};
  const std::string alphabet = "{}[],:\" \\0123456789.-+eEtrufalsn\tu/xbd";
  std::mt19937 rng(7);
  int valid_count = 0, checked = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string doc = seeds[rng() % seeds.size()];
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const size_t at = rng() % (doc.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          doc.insert(doc.begin() + int64_t(at), c);
          break;
        case 1:
          if (at < doc.size()) doc.erase(doc.begin() + int64_t(at));
          break;
        default:
          if (at < doc.size()) doc[at] = c;
      }
    }
    bool parser_ok = false;
    try {
      parser_ok = nlohmann::json::parse(doc).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      continue;  // grammatical, but a number past double's range (1e999): the parser's limit, not JSON's
    } catch (const nlohmann::json::parse_error&) {
    }
    const bool matcher_ok = valid(s, doc);
    EXPECT_EQ(matcher_ok, parser_ok) << doc;
    valid_count += parser_ok;
    ++checked;
  }
  EXPECT_GT(valid_count, 1000);  // the edits leave enough valid documents to compare
  EXPECT_GT(checked, 19000);
}

TEST(JsonObject, SurrogatesOnlyInPairs) {
  auto s = JsonSchema::any_object();
  EXPECT_TRUE(valid(s, R"({"a": "\uD83D\uDE00"})"));
  EXPECT_TRUE(valid(s, R"({"a": "\uD7FF\uE000"})"));           // next to the surrogates, not in them
  EXPECT_EQ(rejected_at(s, R"({"a": "\uDE00"})"), 10u);        // a lone low half
  EXPECT_EQ(rejected_at(s, R"({"a": "\uD83Dx"})"), 13u);       // a high half alone
  EXPECT_EQ(rejected_at(s, R"({"a": "\uD83D\u0041"})"), 15u);  // followed by no low half
}

TEST(JsonObject, MalformedUtf8IsRejected) {
  auto s = JsonSchema::any_object();
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\xC0\xAF\"}"), 7u);          // overlong
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\xED\xA0\x80\"}"), 8u);      // an encoded surrogate
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\xE2\x82\"}"), 9u);          // cut short
  EXPECT_EQ(rejected_at(s, "{\"a\": \"\xF4\x90\x80\x80\"}"), 8u);  // past U+10FFFF
}

TEST(JsonObject, WhitespaceRunsAreCapped) {
  auto s = JsonSchema::any_object();
  const std::string ok(kMaxWhitespaceRun, ' ');
  EXPECT_TRUE(valid(s, ok + "{" + ok + "\"a\"" + ok + ":" + ok + "1" + ok + "}" + ok));
  EXPECT_EQ(rejected_at(s, "{" + ok + " }"), 1 + ok.size());
  EXPECT_EQ(rejected_at(s, "{}" + ok + "\n"), 2 + ok.size());
  // Spaces inside strings are text, not whitespace between tokens.
  EXPECT_TRUE(valid(s, "{\"a\": \"" + ok + ok + "\"}"));
}

TEST(JsonSchema, ObjectPropertiesRequiredAndNoExtras) {
  auto s = schema(R"({"type": "object",
      "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "nick": {"type": "string"}},
      "required": ["name", "age"]})");
  EXPECT_TRUE(valid(s, R"({"name": "Ann", "age": 41})"));
  EXPECT_TRUE(valid(s, R"({"age": 41, "nick": "A", "name": "Ann"})"));  // any order
  EXPECT_EQ(rejected_at(s, R"({"name": "Ann"})"), 14u);                 // '}' before age
  EXPECT_EQ(rejected_at(s, R"({"email": 1})"), 2u);                     // not a property (default: strict)
  EXPECT_EQ(rejected_at(s, R"({"name": "A", "name": "B"})"), 16u);      // no property twice ("n" of nick)
  EXPECT_EQ(rejected_at(s, R"({"age": 4.5})"), 9u);                     // integer: no fraction
  EXPECT_EQ(rejected_at(s, R"({"age": "4"})"), 8u);
  EXPECT_TRUE(prefix_only(s, R"({"na)"));
  // Every property written: only '}' is left.
  EXPECT_EQ(rejected_at(s, R"({"name": "A", "age": 1, "nick": "B", )"), 35u);
}

TEST(JsonSchema, AdditionalPropertiesWhenAllowed) {
  auto any = schema(R"({"type": "object", "properties": {"n": {"type": "integer"}},
                        "additionalProperties": true})");
  EXPECT_TRUE(valid(any, R"({"n": 1, "x": [true, {"y": null}]})"));
  EXPECT_EQ(rejected_at(any, R"({"n": "one"})"), 6u);  // a listed key keeps its schema
  auto typed = schema(R"({"type": "object", "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(valid(typed, R"({"a": true, "b": false})"));
  EXPECT_EQ(rejected_at(typed, R"({"a": 1})"), 6u);
  auto bare = schema(R"({"type": "object"})");
  EXPECT_TRUE(valid(bare, R"({"anything": [1, 2]})"));
}

TEST(JsonSchema, ArraysWithItemsAndBounds) {
  auto s = schema(R"({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3})");
  EXPECT_TRUE(valid(s, "[1]"));
  EXPECT_TRUE(valid(s, "[1, -2.5, 3e2]"));
  EXPECT_EQ(rejected_at(s, "[]"), 1u);
  EXPECT_EQ(rejected_at(s, "[1, 2, 3, 4]"), 8u);
  EXPECT_EQ(rejected_at(s, "[\"a\"]"), 1u);
  EXPECT_TRUE(prefix_only(s, "[1, 2"));
}

TEST(JsonSchema, ScalarsEnumsAndConst) {
  EXPECT_TRUE(valid(schema(R"({"type": "string"})"), R"("hi")"));
  EXPECT_TRUE(valid(schema(R"({"type": "number"})"), "-0.5e+10"));
  EXPECT_TRUE(prefix_only(schema(R"({"type": "number"})"), "-0.5e"));
  EXPECT_TRUE(valid(schema(R"({"type": "integer"})"), "-12"));
  EXPECT_TRUE(valid(schema(R"({"type": "boolean"})"), "false"));
  EXPECT_EQ(rejected_at(schema(R"({"type": "boolean"})"), "null"), 0u);
  EXPECT_TRUE(valid(schema(R"({"type": "null"})"), "null"));
  EXPECT_TRUE(valid(schema(R"({"type": ["string", "null"]})"), "null"));
  EXPECT_TRUE(valid(schema(R"({"type": ["string", "null"]})"), R"("x")"));
  auto color = schema(R"({"enum": ["red", "green", 7, 75, null]})");
  EXPECT_TRUE(valid(color, R"("green")"));
  EXPECT_TRUE(valid(color, "7"));
  EXPECT_TRUE(valid(color, "75"));
  EXPECT_TRUE(valid(color, "null"));
  EXPECT_EQ(rejected_at(color, R"("blue")"), 1u);
  EXPECT_EQ(rejected_at(color, "8"), 0u);
  EXPECT_EQ(rejected_at(color, "756"), 2u);
  auto inside = schema(R"({"type": "object", "properties": {"c": {"const": "x"}, "n": {"enum": [1, 12]}},
                           "required": ["c", "n"]})");
  EXPECT_TRUE(valid(inside, R"({"c": "x", "n": 1})"));
  EXPECT_TRUE(valid(inside, R"({"n": 12 , "c":"x"})"));
  EXPECT_EQ(rejected_at(inside, R"({"c": "y")"), 7u);
  // enum values keep to the schema's type
  EXPECT_EQ(rejected_at(schema(R"({"type": "string", "enum": ["a", 1]})"), "1"), 0u);
}

// Pydantic's Optional[X]: anyOf X or null; alternatives of different types are exact.
TEST(JsonSchema, AnyOfAlternativesOfDifferentTypes) {
  auto s =
      schema(R"({"type": "object", "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]}},
      "properties": {"p": {"anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}], "default": null},
                     "q": {"oneOf": [{"type": "array", "items": {"type": "string"}, "maxItems": 1},
                                     {"type": "integer"}, {"type": "boolean"}]},
                     "r": {"anyOf": [{"enum": ["a", 1]}, {"const": null}]}},
      "required": ["p", "q", "r"]})");
  EXPECT_TRUE(valid(s, R"({"p": {"x": 1}, "q": ["s"], "r": "a"})"));
  EXPECT_TRUE(valid(s, R"({"p": null, "q": 5, "r": null})"));
  EXPECT_TRUE(valid(s, R"({"p": null, "q": true, "r": 1})"));
  EXPECT_EQ(rejected_at(s, R"({"p": {"y": 1}})"), 8u);
  EXPECT_EQ(rejected_at(s, R"({"p": null, "q": ["a", "b"]})"), 21u);  // maxItems 1: no comma
  EXPECT_EQ(rejected_at(s, R"({"p": null, "q": 1.5})"), 18u);         // integer
  EXPECT_EQ(rejected_at(s, R"({"p": null, "q": 1, "r": "b"})"), 26u);
}

TEST(JsonSchema, NestingAndLocalReferences) {
  auto s = schema(R"({
    "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}, "required": ["v"]}},
    "$ref": "#/$defs/Node"})");
  EXPECT_TRUE(valid(s, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
  EXPECT_EQ(rejected_at(s, R"({"v": 1, "kids": [{"w": 2}]})"), 20u);
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  auto keyword = [](const char* text) {
    try {
      schema(text);
    } catch (const SchemaError& e) {
      return e.keyword;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(keyword(R"({"type": "string", "pattern": "^a"})"), "pattern");
  EXPECT_EQ(keyword(R"({"type": "string", "minLength": 2})"), "minLength");
  EXPECT_EQ(keyword(R"({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}})"),
            "format");
  EXPECT_EQ(keyword(R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})"), "anyOf");
  EXPECT_EQ(keyword(R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {}}]})"), "oneOf");
  EXPECT_EQ(keyword(R"({"anyOf": [{"enum": ["a"]}, {"type": "string"}]})"), "anyOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"type": "string"}]})"), "allOf");
  EXPECT_EQ(keyword(R"({"anyOf": [{"type": "string"}], "minLength": 1})"), "minLength");
  EXPECT_EQ(keyword(R"({"type": "strng"})"), "type");
  EXPECT_EQ(keyword(R"({"type": "object", "properties": {}, "required": ["x"]})"), "required");
  EXPECT_EQ(keyword(R"({"$ref": "https://example.com/s.json"})"), "$ref");
  EXPECT_EQ(keyword(R"({"enum": [[1]]})"), "enum");
  EXPECT_EQ(keyword(R"({"type": "string", "items": {}})"), "items");
  EXPECT_EQ(keyword(R"({"type": "object", "title": "T", "description": "d"})"), "(accepted)");
}

TEST(JsonMatcher, AcceptsChecksWithoutChanging) {
  JsonMatcher m(JsonSchema::any_object());
  EXPECT_TRUE(m.accepts("{\"a\""));
  EXPECT_FALSE(m.accepts("x"));
  EXPECT_TRUE(m.advance("{\"a\": 1"));
  EXPECT_FALSE(m.advance("1x"));  // rejected: nothing of it is taken
  EXPECT_TRUE(m.advance("2}"));
  EXPECT_TRUE(m.can_end());
}

}  // namespace
}  // namespace moeserve
