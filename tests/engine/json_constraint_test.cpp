#include "engine/json_constraint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <functional>
#include <random>
#include <regex>
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
    static const std::regex kLongExponent("[eE][+-]?[0-9]{3}");
    if (std::regex_search(doc, kLongExponent))
      continue;  // exponents have at most two digits (json_matcher.cpp)
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
  // Without bounds, exponents of at most two digits: 1e400 is infinite to the parsers clients use.
  EXPECT_TRUE(valid(schema(R"({"type": "number"})"), "1e-99"));
  EXPECT_EQ(rejected_at(schema(R"({"type": "number"})"), "1e400"), 4u);
  EXPECT_TRUE(valid(schema(R"({"type": "number", "minimum": 1e150})"), "2e150"));
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

// pydantic's Union[Literal["a"], Literal["b"]]: const alternatives of one type are one set of values.
TEST(JsonSchema, AnyOfConstAlternativesOfOneType) {
  auto s = schema(R"({"anyOf": [{"const": "a"}, {"const": "ab"}, {"enum": ["b", 2]}, {"const": 21}]})");
  for (const char* ok : {R"("a")", R"("ab")", R"("b")", "2", "21"}) EXPECT_TRUE(valid(s, ok)) << ok;
  EXPECT_EQ(rejected_at(s, R"("c")"), 1u);
  EXPECT_EQ(rejected_at(s, "22"), 1u);
}

// Alternatives of one type that one node holds exactly: strings that differ in pattern/format (pydantic's
// Union[date, datetime]), an integer or an unbounded number (Union[int, float]), nulls twice.
TEST(JsonSchema, AnyOfAlternativesOfOneTypeThatUnite) {
  auto s = schema(R"({"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^x+$"},
                                {"type": "null"}, {"type": ["integer", "null"]}, {"type": "number"}]})");
  for (const char* ok : {R"("2024-02-29")", R"("xx")", "null", "3", "-2.5e3"})
    EXPECT_TRUE(valid(s, ok)) << ok;
  EXPECT_EQ(rejected_at(s, R"("2023-02-29")"), 10u);
  EXPECT_EQ(rejected_at(s, R"("xy")"), 2u);
  auto any = schema(R"({"anyOf": [{"type": "string", "pattern": "^a$"}, {"type": "string"}]})");
  EXPECT_TRUE(valid(any, R"("anything")"));
}

// pydantic's Union[Cat, Dog] (anyOf of $refs): each alternative's keys and values, never a mix of them.
TEST(JsonSchemaUnion, AnyOfObjects) {
  auto s = schema(R"({"$defs": {
      "Cat": {"type": "object", "properties": {"name": {"type": "string"}, "lives": {"type": "integer",
              "maximum": 9}}, "required": ["name", "lives"]},
      "Dog": {"type": "object", "properties": {"name": {"type": "string"}, "good": {"type": "boolean"}},
              "required": ["name"]}},
      "anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]})");
  EXPECT_TRUE(valid(s, R"({"name": "Tom", "lives": 9})"));
  EXPECT_TRUE(valid(s, R"({"lives": 3, "name": "Tom"})"));
  EXPECT_TRUE(valid(s, R"({"name": "Rex", "good": true})"));
  EXPECT_TRUE(valid(s, R"({"name": "Rex"})"));
  EXPECT_EQ(rejected_at(s, R"({"name": "Tom", "lives": 3, "good")"), 26u);  // a Cat has no more keys
  EXPECT_EQ(rejected_at(s, R"({"lives": 10)"), 11u);
  EXPECT_EQ(rejected_at(s, R"({"good": true, "lives")"), 16u);
  EXPECT_EQ(rejected_at(s, R"({"lives": 3})"), 11u);  // a Cat needs its name
  EXPECT_EQ(rejected_at(s, "null"), 0u);
}

// A discriminated union as pydantic writes it: oneOf, the discriminator hint, a const per alternative. The
// discriminator may come last; until it does, both alternatives are followed.
TEST(JsonSchemaUnion, DiscriminatedOneOf) {
  auto s = schema(R"({"type": "object", "$defs": {
      "Cat": {"type": "object", "properties": {"pet_type": {"const": "cat", "type": "string"},
              "meows": {"type": "integer"}}, "required": ["pet_type", "meows"]},
      "Dog": {"type": "object", "properties": {"pet_type": {"const": "dog", "type": "string"},
              "barks": {"type": "number"}, "meows": {"type": "string"}}, "required": ["pet_type", "barks"]}},
      "properties": {"pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                             "discriminator": {"propertyName": "pet_type",
                                               "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}},
      "required": ["pet"]})");
  EXPECT_TRUE(valid(s, R"({"pet": {"pet_type": "cat", "meows": 3}})"));
  EXPECT_TRUE(valid(s, R"({"pet": {"meows": "woof", "barks": 1.5, "pet_type": "dog"}})"));
  EXPECT_TRUE(valid(s, R"({"pet": {"meows": 2, "pet_type": "cat"}})"));
  EXPECT_EQ(rejected_at(s, R"({"pet": {"meows": 2, "pet_type": "d")"), 34u);  // 2 is no dog's meows
  EXPECT_EQ(rejected_at(s, R"({"pet": {"pet_type": "cat", "barks")"), 29u);
  EXPECT_EQ(rejected_at(s, R"({"pet": {"pet_type": "bird")"), 22u);
}

// Alternatives one node cannot hold, followed at once: a bounded integer and a bounded number, an enum and
// a type, overlapping objects. The states merge again once the union's value ends.
TEST(JsonSchemaUnion, OverlappingAlternativesAndStatesMergeAgain) {
  auto n = schema(R"({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "number", "minimum": -1,
                                "maximum": 1}]})");
  for (const char* ok : {"7", "0.5", "-1", "1e0", "1234567", "75e-2"}) EXPECT_TRUE(valid(n, ok)) << ok;
  EXPECT_TRUE(prefix_only(n, "7.5"));
  EXPECT_TRUE(prefix_only(n, "-2"));
  EXPECT_EQ(rejected_at(n, "-1.5e+"), 5u);
  auto e = schema(R"({"anyOf": [{"enum": [1, "a"]}, {"type": "string", "maxLength": 2}]})");
  for (const char* ok : {"1", R"("a")", R"("bc")"}) EXPECT_TRUE(valid(e, ok)) << ok;
  EXPECT_EQ(rejected_at(e, "12"), 1u);
  EXPECT_EQ(rejected_at(e, R"("abc")"), 3u);
  auto a = schema(R"({"type": "array", "items": {"anyOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}}, "required": ["b"]}]}})");
  JsonMatcher m(a);
  ASSERT_TRUE(m.advance(R"([{"a": 1)"));
  EXPECT_EQ(m.states(), 2u);
  EXPECT_TRUE(m.accepts("}"));
  EXPECT_TRUE(m.accepts(R"(, "b": null})"));
  ASSERT_TRUE(m.advance(R"(}, {"b": null}, {)"));
  EXPECT_EQ(m.states(), 2u);
  ASSERT_TRUE(m.advance(R"("a": 2, "b": null}])"));
  EXPECT_EQ(m.states(), 1u);
  EXPECT_TRUE(m.can_end());
}

// multipleOf: whole steps, on integers (a number schema's multiples are integers), with the bounds.
TEST(JsonSchema, MultipleOf) {
  auto s = schema(R"({"type": "integer", "multipleOf": 5})");
  for (const char* ok : {"0", "15", "-20", "100000"}) EXPECT_TRUE(valid(s, ok)) << ok;
  EXPECT_TRUE(prefix_only(s, "12"));  // 120 is one
  EXPECT_EQ(rejected_at(s, "-0"), 2u);
  auto b = schema(R"({"type": "number", "minimum": 1, "maximum": 12, "multipleOf": 5})");
  for (const char* ok : {"5", "10"}) EXPECT_TRUE(valid(b, ok)) << ok;
  EXPECT_EQ(rejected_at(b, "2"), 0u);
  EXPECT_EQ(rejected_at(b, "15"), 1u);
  EXPECT_EQ(rejected_at(b, "5.0"), 1u);  // written as an integer
  EXPECT_EQ(rejected_at(b, "-"), 0u);
  auto big = schema(R"({"type": "integer", "multipleOf": 7, "minimum": 999999999999990})");
  EXPECT_TRUE(valid(big, "999999999999994"));
  EXPECT_EQ(rejected_at(big, "9999999999999940"), 15u);  // past the magnitudes a double holds exactly
  auto e = schema(R"({"type": "integer", "multipleOf": 3, "enum": [1, 3, 4, 6]})");
  EXPECT_TRUE(valid(e, "6"));
  EXPECT_EQ(rejected_at(e, "4"), 0u);
}

// Fractional multipleOf, exact on the decimal text: 0.07 is a multiple of 0.01 (0.07 / 0.01 is
// 7.000000000000001 in doubles), written without an exponent and with at most the step's decimals.
TEST(JsonSchema, FractionalMultipleOfIsExactDecimal) {
  auto cents = schema(R"({"type": "number", "multipleOf": 0.01})");
  for (const char* ok : {"0.07", "12.35", "-3", "0", "100.1", "-0.01", "9999999.99"})
    EXPECT_TRUE(valid(cents, ok)) << ok;
  EXPECT_EQ(rejected_at(cents, "0.075"), 4u);
  EXPECT_EQ(rejected_at(cents, "0.070"), 4u);  // the step's decimals at most, as JSON.stringify writes it
  EXPECT_EQ(rejected_at(cents, "1e2"), 1u);
  EXPECT_EQ(rejected_at(cents, "10000000"), 7u);  // 10^9 cents: past the magnitudes kept (json_number.h)
  EXPECT_TRUE(prefix_only(cents, "12."));

  auto quarters = schema(R"({"type": "number", "multipleOf": 0.25, "minimum": 0.3, "exclusiveMaximum": 1})");
  for (const char* ok : {"0.5", "0.75"}) EXPECT_TRUE(valid(quarters, ok)) << ok;
  EXPECT_EQ(rejected_at(quarters, "0.25"), 2u);  // no multiple in [0.20, 0.29]
  EXPECT_EQ(rejected_at(quarters, "1"), 0u);
  EXPECT_EQ(rejected_at(quarters, "0.76"), 3u);

  auto wide = schema(R"({"type": "number", "multipleOf": 2.5})");
  for (const char* ok : {"7.5", "5", "-2.5", "0"}) EXPECT_TRUE(valid(wide, ok)) << ok;
  EXPECT_EQ(rejected_at(wide, "2.4"), 2u);
  EXPECT_EQ(rejected_at(wide, "2.55"), 3u);

  // On integers a fractional step is the whole step its integer multiples share: 1.5 -> 3, 0.5 -> 1.
  auto threes = schema(R"({"type": "integer", "multipleOf": 1.5})");
  EXPECT_TRUE(valid(threes, "6"));
  EXPECT_TRUE(prefix_only(threes, "4"));  // 42 is one
  EXPECT_TRUE(valid(threes, "-12"));
  EXPECT_EQ(rejected_at(threes, "1.5"), 1u);  // an integer
  EXPECT_TRUE(valid(schema(R"({"type": "integer", "multipleOf": 0.5})"), "7"));
}

// allOf, merged into one schema where that keeps its meaning: pydantic's $ref wrapper, zod's intersections
// of objects, parts with different keywords.
TEST(JsonSchema, AllOfMergesWherePydanticAndZodWriteIt) {
  auto pet = schema(R"({"$defs": {"Pet": {"type": "object", "properties": {"name": {"type": "string"}},
                                          "required": ["name"]},
                                  "Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                          "next": {"anyOf": [{"allOf": [{"$ref": "#/$defs/Node"}]}, {"type": "null"}]}},
                                          "required": ["v"]}},
                        "type": "object",
                        "properties": {"pet": {"allOf": [{"$ref": "#/$defs/Pet"}], "description": "The pet",
                                               "default": {"name": "Rex"}},
                                       "list": {"allOf": [{"$ref": "#/$defs/Node"}]}},
                        "required": ["pet"]})");
  EXPECT_TRUE(valid(pet, R"({"pet": {"name": "Tom"}, "list": {"v": 1, "next": {"v": 2, "next": null}}})"));
  EXPECT_EQ(rejected_at(pet, R"({"pet": {"nick)"), 11u);

  // Open objects (additionalProperties true): every key, each property under every part that lists it.
  auto open = schema(R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"],
       "additionalProperties": true},
      {"properties": {"a": {"maximum": 5}, "b": {"type": "string"}}, "additionalProperties": true}]})");
  EXPECT_TRUE(valid(open, R"({"a": 5, "b": "x", "c": null})"));
  EXPECT_EQ(rejected_at(open, R"({"a": 6)"), 6u);
  EXPECT_TRUE(prefix_only(open, R"({"b": "x")"));  // a is required by the first part

  // A closed part keeps out the keys it does not list, whatever the other parts allow.
  auto closed = schema(R"({"allOf": [
      {"properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]},
      {"properties": {"a": {"minimum": 3}}, "additionalProperties": true}]})");
  EXPECT_TRUE(valid(closed, R"({"a": 3, "b": true})"));
  EXPECT_EQ(rejected_at(closed, R"({"a": -)"), 6u);
  EXPECT_EQ(rejected_at(closed, R"({"a": 3, "c)"), 10u);

  // Parts with different keywords: their union; integer and number are integer.
  auto up_to_three = schema(R"({"allOf": [{"type": "integer"}, {"maximum": 3}], "title": "n"})");
  EXPECT_TRUE(valid(up_to_three, "-3"));
  EXPECT_EQ(rejected_at(up_to_three, "4"), 0u);
  EXPECT_EQ(rejected_at(up_to_three, "3."), 1u);
  EXPECT_EQ(rejected_at(schema(R"({"allOf": [{"type": "number"}, {"type": "integer"}]})"), "1.5"), 1u);
  // A keyword in two parts: the tighter bound, the values both enums hold.
  auto tighter = schema(R"({"allOf": [{"type": "string", "minLength": 1, "maxLength": 9}, {"minLength": 2,
                                       "maxLength": 3}]})");
  EXPECT_TRUE(prefix_only(tighter, R"("a)"));
  EXPECT_TRUE(valid(tighter, R"("abc")"));
  EXPECT_EQ(rejected_at(tighter, R"("abcd)"), 4u);
  auto shared = schema(R"({"allOf": [{"enum": ["a", "b", 1]}, {"enum": [1, "b", "c"]}]})");
  EXPECT_TRUE(valid(shared, R"("b")"));
  EXPECT_TRUE(valid(shared, "1"));
  EXPECT_EQ(rejected_at(shared, R"("a)"), 1u);
  auto code = schema(R"({"$defs": {"Code": {"type": "string", "pattern": "^[A-Z]+$"}},
                         "allOf": [{"$ref": "#/$defs/Code"}, {"maxLength": 3}]})");
  EXPECT_TRUE(valid(code, R"("ABC")"));
  EXPECT_EQ(rejected_at(code, R"("ABCD")"), 4u);
}

TEST(JsonSchema, AllOfThatCannotMergeIsRefusedNamingAllOf) {
  auto keyword = [](const char* text) {
    try {
      schema(text);
    } catch (const SchemaError& e) {
      return e.keyword;
    }
    return std::string("(accepted)");
  };
  // Two closed objects with different keys: no object passes both.
  EXPECT_EQ(keyword(R"({"allOf": [{"properties": {"a": {}}, "required": ["a"], "additionalProperties": false},
                                  {"properties": {"b": {}}, "required": ["b"], "additionalProperties": false}]})"),
            "allOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"type": "object", "properties": {"a": {}}}, {"type": "string"}]})"),
            "allOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})"), "allOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"items": {"type": "string"}}, {"prefixItems": [{"type": "string"}]}]})"),
            "allOf");
  EXPECT_EQ(
      keyword(
          R"({"allOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "object"}]})"),
      "allOf");
  EXPECT_EQ(
      keyword(
          R"({"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}, {"type": "object"}]}}, "$ref": "#/$defs/A"})"),
      "allOf");
  EXPECT_EQ(keyword(R"({"allOf": []})"), "allOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"type": "string"}, false]})"), "allOf");
}

// Objects and arrays in enum/const: matched as their canonical text (compact, keys as nlohmann orders them).
TEST(JsonSchema, EnumAndConstOfObjectsAndArrays) {
  auto s = schema(R"({"type": "object", "properties": {"c": {"const": {"b": [1, {"x": null}], "a": "é"}},
                                                          "e": {"enum": [[1, 2], {}, "s"]}}, "required": ["c"]})");
  EXPECT_TRUE(valid(s, R"({"c": {"a":"é","b":[1,{"x":null}]}, "e": [1,2]})"));
  EXPECT_TRUE(valid(s, R"({"c": {"a":"é","b":[1,{"x":null}]}, "e": {}})"));
  EXPECT_TRUE(valid(s, R"({"c": {"a":"é","b":[1,{"x":null}]}, "e": "s"})"));
  EXPECT_EQ(rejected_at(s, R"({"c": {"a":"é","b":[2)"), 21u);
  EXPECT_EQ(rejected_at(s, R"({"c": {"a":"é","b":[1,{"x":null}]}, "e": [1,3])"), 45u);
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
  EXPECT_EQ(keyword(R"({"type": "string", "pattern": "(?<=a)b"})"), "pattern");
  EXPECT_EQ(keyword(R"({"type": "number", "multipleOf": 0.0000001})"), "multipleOf");
  EXPECT_EQ(keyword(R"({"type": "integer", "multipleOf": 0})"), "multipleOf");
  EXPECT_EQ(keyword(R"({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5})"), "multipleOf");
  EXPECT_EQ(keyword(R"({"type": "string", "multipleOf": 2})"), "multipleOf");
  EXPECT_EQ(keyword(R"({"type": "object", "properties": {"a": {"type": "string", "format": "ipv5"}}})"),
            "format");
  EXPECT_EQ(keyword(R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {}}]})"), "oneOf");
  EXPECT_EQ(keyword(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"), "oneOf");
  EXPECT_EQ(keyword(R"({"oneOf": [{"enum": ["a", "b"]}, {"const": "b"}]})"), "oneOf");
  EXPECT_EQ(keyword(R"({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]})"), "allOf");
  EXPECT_EQ(keyword(R"({"anyOf": [{"type": "string"}], "minLength": 1})"), "minLength");
  EXPECT_EQ(keyword(R"({"type": "strng"})"), "type");
  EXPECT_EQ(keyword(R"({"type": []})"), "type");
  EXPECT_EQ(keyword(R"({"type": "object", "properties": {}, "required": ["x"]})"), "required");
  EXPECT_EQ(keyword(R"({"$ref": "https://example.com/s.json"})"), "$ref");
  EXPECT_EQ(keyword(R"({"type": "array", "items": {}, "enum": [[1]]})"), "enum");
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

// The SchemaError a schema gets (keyword "(accepted)" when it compiles).
SchemaError refusal(const json& s, const JsonSchemaLimits& limits = {}) {
  try {
    JsonSchema::compile(s, limits);
  } catch (const SchemaError& e) {
    return e;
  }
  return SchemaError("(accepted)", "", "");
}

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// {"items": {"items": ... {} ...}}: `levels` subschemas below the root.
json nested_items(size_t levels) {
  std::string text;
  for (size_t i = 0; i < levels; ++i) text += R"({"items": )";
  text += "{}";
  text += std::string(levels, '}');
  return json::parse(text);
}

// make(limit) compiles; make(limit + 1) is refused, the error naming the limit and saying `message`.
void expect_limit(const std::function<json(size_t)>& make, size_t limit, const std::string& keyword,
                  std::string_view message, const JsonSchemaLimits& limits = {}) {
  EXPECT_EQ(refusal(make(limit), limits).keyword, "(accepted)");
  const SchemaError e = refusal(make(limit + 1), limits);
  EXPECT_EQ(e.keyword, keyword);
  EXPECT_TRUE(has(e.what(), message)) << e.what();
}

TEST(JsonSchemaLimits, DepthCountsSubschemasAndIsCheckedBeforeRecursing) {
  expect_limit(nested_items, 64, "max_depth", "more than 64 subschemas deep");
  // Far past the limit (where the unbounded compiler overflowed its stack): the same error.
  EXPECT_EQ(refusal(nested_items(100000)).keyword, "max_depth");
  // $ref hops count: a chain of 10,000 definitions, each a reference to the next, stops at the limit too.
  json defs = json::object();
  for (int i = 0; i < 10000; ++i)
    defs["D" + std::to_string(i)] = {{"$ref", "#/$defs/D" + std::to_string(i + 1)}};
  defs["D10000"] = {{"type", "string"}};
  EXPECT_EQ(refusal({{"$defs", defs}, {"$ref", "#/$defs/D0"}}).keyword, "max_depth");
  // Within the limit, the chain is the string it ends in.
  json few = json::object();
  for (int i = 0; i < 20; ++i) few["D" + std::to_string(i)] = {{"$ref", "#/$defs/D" + std::to_string(i + 1)}};
  few["D20"] = {{"type", "string"}};
  EXPECT_TRUE(valid(JsonSchema::compile({{"$defs", few}, {"$ref", "#/$defs/D0"}}), R"("s")"));
}

// An object of `count` properties p0, p1, ... of type string.
json object_of(size_t count, size_t from = 0) {
  json props = json::object();
  for (size_t i = 0; i < count; ++i) props["p" + std::to_string(from + i)] = {{"type", "string"}};
  return {{"type", "object"}, {"properties", props}};
}

TEST(JsonSchemaLimits, PropertiesPerObjectAndInTotal) {
  expect_limit([](size_t n) { return object_of(n); }, 64, "properties", "at most 64 properties");
  // 5,000 in total (OpenAI's limit): a root of 20 objects of 20 objects of 11 or 12 string properties (and
  // what is past 5,000 in the first).
  auto total = [](size_t count) {
    const size_t extra = count - 5000;
    json root = {{"type", "object"}, {"properties", json::object()}};
    size_t n = 0, leaf = 0;
    for (size_t i = 0; i < 20; ++i) {
      json mid = {{"type", "object"}, {"properties", json::object()}};
      for (size_t j = 0; j < 20; ++j, ++leaf) {
        const size_t here = 11 + (leaf < 180) + (leaf == 0 ? extra : 0);
        mid["properties"]["o" + std::to_string(j)] = object_of(here, n);
        n += here;
      }
      root["properties"]["m" + std::to_string(i)] = mid;
    }
    return root;
  };
  expect_limit(total, 5000, "max_properties", "more than 5000 properties");  // 20 + 400 + 400 * 11 + 180
}

json enum_of(size_t count) {
  json values = json::array();
  for (size_t i = 0; i < count; ++i) values.push_back(i);
  return {{"enum", values}};
}

TEST(JsonSchemaLimits, EnumValuesInTotal) {
  expect_limit(enum_of, 100000, "max_enum_values", "more than 100000 enum/const values");
  // Across the schema, const included.
  JsonSchemaLimits three;
  three.max_enum_values = 3;
  const json two_and_one = json::parse(R"({"type": "object", "properties": {"a": {"enum": [1, 2]},
                                           "b": {"const": "x"}}})");
  EXPECT_EQ(refusal(two_and_one, three).keyword, "(accepted)");
  three.max_enum_values = 2;
  EXPECT_EQ(refusal(two_and_one, three).keyword, "max_enum_values");
}

TEST(JsonSchemaLimits, LiteralBytesCountValuesAndNames) {
  // "ab" is 4 bytes of JSON, 12 is 2, the name "k" is 3: 9 in all.
  const json s = json::parse(R"({"type": "object", "properties": {"k": {"enum": ["ab", 12]}}})");
  JsonSchemaLimits limits;
  limits.max_literal_bytes = 9;
  EXPECT_EQ(refusal(s, limits).keyword, "(accepted)");
  limits.max_literal_bytes = 8;
  EXPECT_EQ(refusal(s, limits).keyword, "max_literal_bytes");
  // The default: a megabyte (a string of n - 2 characters is n bytes of JSON).
  expect_limit(
      [](size_t n) {
        return json{{"const", std::string(n - 2, 'x')}};
      },
      1 << 20, "max_literal_bytes", "more than 1048576 bytes");
}

TEST(JsonSchemaLimits, NodesCountSubschemasOnce) {
  // The root, the reference's node and its target's: used twice, compiled once.
  const json s = json::parse(R"({"type": "object", "$defs": {"S": {"type": "string"}},
      "properties": {"a": {"$ref": "#/$defs/S"}, "b": {"$ref": "#/$defs/S"}}})");
  JsonSchemaLimits limits;
  limits.max_nodes = 3;
  EXPECT_EQ(refusal(s, limits).keyword, "(accepted)");
  EXPECT_EQ(JsonSchema::compile(s, limits)->node_count(), 3u);
  limits.max_nodes = 2;
  EXPECT_EQ(refusal(s, limits).keyword, "max_nodes");
  // The default: an anyOf node and its alternatives.
  auto consts = [](size_t nodes) {
    json alternatives = json::array();
    for (size_t i = 1; i < nodes; ++i) alternatives.push_back({{"type", "integer"}, {"const", i}});
    return json{{"anyOf", alternatives}};
  };
  expect_limit(consts, 65536, "max_nodes", "more than 65536 subschemas");
}

// A 100,000-value enum compiles, and a decode step costs what it costs with 10 values: checking a token is a
// copy of the stack and a few steps per byte, never a walk over the values.
TEST(JsonSchemaLimits, LargeEnumStepsCostNoMoreThanSmallOnes) {
  auto words = [](size_t count) {
    std::mt19937 rng(5);
    json values = json::array();
    for (size_t i = 0; i < count; ++i) {
      std::string w(3 + rng() % 8, 'a');
      for (char& c : w) c = char('a' + rng() % 26);
      values.push_back(w);
    }
    return values;
  };
  // A vocabulary of every one- and two-letter piece, with and without a quote.
  std::vector<std::string> vocab;
  for (char a = 'a'; a <= 'z'; ++a) {
    vocab.push_back({a});
    vocab.push_back({a, '"'});
    for (char b = 'a'; b <= 'z'; ++b) vocab.push_back({a, b});
  }
  size_t vocab_bytes = 0;
  for (const std::string& t : vocab) vocab_bytes += t.size();
  for (size_t count : {size_t{10}, size_t{100000}}) {
    SCOPED_TRACE(count);
    const json values = words(count);
    JsonMatcher m(JsonSchema::compile(
        {{"type", "object"}, {"properties", {{"k", {{"enum", values}}}}}, {"required", {"k"}}}));
    ASSERT_TRUE(m.advance(R"({"k": ")"));
    const uint64_t before = m.work();
    size_t allowed = 0;
    for (const std::string& t : vocab) allowed += m.accepts(t);
    const uint64_t work = m.work() - before;
    // Per token a copy of the three frames; per byte the byte, a trie step and at most one frame finishing.
    EXPECT_LE(work, 3 * vocab.size() + 3 * vocab_bytes);
    EXPECT_GE(allowed, 10u);
    // Every value is still exact.
    const std::string last = values.back().get<std::string>();
    EXPECT_TRUE(m.advance(last + "\"}"));
    EXPECT_TRUE(m.can_end());
  }
}

TEST(JsonSchema, EnumTrieKeepsPrefixesDuplicatesAndEscapes) {
  auto s = schema(R"({"enum": ["ab", "abc", "ab", 1, 12, 123, "a\"b", "\u00e9", true]})");
  for (const char* ok : {R"("ab")", R"("abc")", "1", "12", "123", R"("a\"b")", "\"\xC3\xA9\"", "true"})
    EXPECT_TRUE(valid(s, ok)) << ok;
  EXPECT_TRUE(prefix_only(s, R"("a)"));
  EXPECT_EQ(rejected_at(s, R"("abd")"), 3u);
  EXPECT_EQ(rejected_at(s, "1234"), 3u);
  EXPECT_EQ(rejected_at(s, "false"), 0u);
  EXPECT_EQ(rejected_at(s, R"("\u00e9")"), 1u);  // the canonical spelling only
}

TEST(JsonSchemaRef, SelfReferenceAloneIsRefusedByName) {
  SchemaError e = refusal(json::parse(R"({"$ref": "#"})"));
  EXPECT_EQ(e.keyword, "$ref");
  EXPECT_TRUE(has(e.what(), "'#' refers to itself")) << e.what();
  e = refusal(json::parse(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                               "$ref": "#/$defs/A"})"));
  EXPECT_EQ(e.keyword, "$ref");
  EXPECT_TRUE(has(e.what(), "'#/$defs/A' refers to itself")) << e.what();
}

TEST(JsonSchemaRef, RecursionWithoutEndIsRefusedByName) {
  for (const char* text : {
           R"({"$defs": {"A": {"type": "object", "properties": {"next": {"$ref": "#/$defs/A"}},
               "required": ["next"]}}, "$ref": "#/$defs/A"})",
           R"({"$defs": {"A": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/A"}}},
               "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}})",
       }) {
    const SchemaError e = refusal(json::parse(text));
    EXPECT_EQ(e.keyword, "$ref") << text;
    EXPECT_EQ(e.path, "#/$defs/A") << text;
    EXPECT_TRUE(has(e.what(), "'#/$defs/A' has no value")) << e.what();
  }
  const SchemaError root = refusal(json::parse(R"({"type": "object", "properties": {"me": {"$ref": "#"}},
                                                   "required": ["me"]})"));
  EXPECT_EQ(root.keyword, "$ref");
  EXPECT_TRUE(has(root.what(), "'#' has no value")) << root.what();
}

// pydantic's linked list (next: Optional["L"]): the anyOf refers to the model that encloses it.
TEST(JsonSchemaRef, RecursionThroughAnyOf) {
  auto s = JsonSchema::compile(json::parse(R"({"$defs": {"L": {"type": "object", "properties":
      {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}},
      "required": ["v", "next"]}}, "$ref": "#/$defs/L"})"));
  EXPECT_TRUE(valid(s, R"({"v": 1, "next": {"v": 2, "next": null}})"));
  EXPECT_EQ(rejected_at(s, R"({"v": 1, "next": {"w")"), 19u);
  // A union that is one of its own alternatives has no value of its own making.
  const SchemaError e = refusal(json::parse(R"({"$defs": {"U": {"anyOf": [{"$ref": "#/$defs/U"},
      {"$ref": "#/$defs/U"}]}}, "$ref": "#/$defs/U"})"));
  EXPECT_EQ(e.keyword, "anyOf");
  EXPECT_TRUE(has(e.what(), "one of its own alternatives")) << e.what();
}

TEST(JsonSchemaRef, ReferencesToReferencesAndSharedTargets) {
  // B is only a reference to A, met while A is compiled: B is A.
  auto s = schema(R"({"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                                "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})");
  EXPECT_TRUE(valid(s, R"({"b": {"b": {}}})"));
  EXPECT_EQ(rejected_at(s, R"({"b": 1})"), 6u);
  auto shared = schema(R"({"definitions": {"N": {"type": "integer"}}, "type": "object",
      "properties": {"x": {"$ref": "#/definitions/N"}, "y": {"$ref": "#/definitions/N"}}, "required": ["x", "y"]})");
  EXPECT_TRUE(valid(shared, R"({"y": 2, "x": 1})"));
  EXPECT_EQ(refusal(json::parse(R"({"$ref": "#/$defs/nothing"})")).keyword, "$ref");
  EXPECT_EQ(refusal(json::parse(R"({"$ref": "#no-slash"})")).keyword, "$ref");
  EXPECT_EQ(refusal(json::parse(R"({"$defs": [1], "$ref": "#/$defs/x"})")).keyword, "$ref");
}

// Recursion within kMaxNesting: where a property's value could not fit below, its key is refused (and other
// keys still come), so the document can always be finished.
TEST(JsonSchemaRef, KeysWhoseValueWouldNotFitAreRefused) {
  auto s = schema(R"({"$defs": {"T": {"type": "object", "properties": {
      "a": {"$ref": "#/$defs/T"},
      "b": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["c"],
            "properties": {"c": {"type": "array", "minItems": 1, "items": {"type": "integer"}}}}}}}},
      "$ref": "#/$defs/T"})");
  auto opening = [](int levels) {
    std::string text;
    for (int i = 0; i < levels; ++i) text += R"({"a": )";
    return text;
  };
  // b needs three containers below its object: with 124 objects around that object it still fits, with 125
  // not, while a does.
  EXPECT_TRUE(prefix_only(s, opening(124) + R"({"b": [{"c": [1)"));
  EXPECT_EQ(rejected_at(s, opening(125) + R"({"b)"), opening(125).size() + 2);
  EXPECT_TRUE(prefix_only(s, opening(125) + R"({"a)"));
  // 128 objects: the last one takes no key (a would be a 129th), only '}'.
  EXPECT_EQ(rejected_at(s, opening(127) + R"({")"), opening(127).size() + 1);
  EXPECT_TRUE(valid(s, opening(127) + "{}" + std::string(127, '}')));
}

TEST(JsonSchemaRef, OtherKeysWhoseValueWouldNotFitAreRefused) {
  // Other keys allowed: a key naming b is refused at its closing quote where b would not fit; any other
  // key (of any schema: here any value) still can be written.
  auto s = schema(R"({"$defs": {"T": {"type": "object", "additionalProperties": true, "properties": {
      "a": {"$ref": "#/$defs/T"},
      "b": {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": {}}}}}},
      "$ref": "#/$defs/T"})");
  std::string deep;
  for (int i = 0; i < 126; ++i) deep += R"({"a": )";
  EXPECT_EQ(rejected_at(s, deep + R"({"b":)"), deep.size() + 3);
  EXPECT_TRUE(prefix_only(s, deep + R"({"bb": 1)"));
  EXPECT_TRUE(prefix_only(s, deep.substr(0, deep.size() - 6) + R"({"b": [[1)"));
}

// Liveness: random walks over what the matcher accepts, first leaning to opening containers (so that they
// reach kMaxNesting), then to closing them, never find a prefix with no way on, and end in a document that
// nlohmann parses.
TEST(JsonSchemaRef, RandomWalksNeverReachADeadEnd) {
  const char* schemas[] = {
      R"({"$defs": {"T": {"type": "object", "required": ["k"], "properties": {
          "k": {"type": "array", "items": {"$ref": "#/$defs/T"}},
          "n": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "array", "minItems": 1,
                "items": {"enum": ["x", "xy", 1, 12, null]}}},
          "o": {"$ref": "#/$defs/T"}}}}, "$ref": "#/$defs/T"})",
      R"({"$defs": {"T": {"type": "object", "additionalProperties": {"$ref": "#/$defs/T"}, "properties": {
          "a": {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": {}}}}}},
          "$ref": "#/$defs/T"})",
      R"({"type": "object", "additionalProperties": true})",
  };
  std::string alphabet;
  for (int c = 0x20; c < 0x7F; ++c) alphabet.push_back(char(c));
  alphabet += "\n\xC3\xA9";
  std::mt19937 rng(11);
  for (const char* text : schemas) {
    SCOPED_TRACE(text);
    auto s = schema(text);
    int deepest = 0;
    for (int walk = 0; walk < 6; ++walk) {
      JsonMatcher m(s);
      std::string doc;
      int depth = 0;  // containers open (outside strings)
      bool in_string = false, escaped = false;
      for (int step = 0; step < 20000 && !(step > 4000 && m.can_end()); ++step) {
        std::string next;
        for (char c : alphabet)
          if (m.accepts(std::string_view(&c, 1))) next.push_back(c);
        if (next.empty()) break;  // only the end may follow
        const std::string_view lean = step < 4000 ? "{[\"ko:," : "}]\"1";
        std::string leaning;
        for (char c : next)
          if (lean.find(c) != std::string::npos) leaning.push_back(c);
        const std::string& from = !leaning.empty() && rng() % 8 != 0 ? leaning : next;
        const char c = from[rng() % from.size()];
        ASSERT_TRUE(m.advance(std::string_view(&c, 1)));
        doc.push_back(c);
        if (in_string) {
          in_string = escaped || c != '"';
          escaped = !escaped && c == '\\';
        } else {
          in_string = c == '"';
          depth += (c == '{' || c == '[') - (c == '}' || c == ']');
          deepest = std::max(deepest, depth);
        }
      }
      ASSERT_TRUE(m.can_end()) << "a dead end or no end after: " << doc;
      EXPECT_TRUE(json::accept(doc)) << doc;
    }
    EXPECT_EQ(deepest, kMaxNesting);
  }
}

TEST(JsonSchemaRef, NeedPastTheNestingLimitIsRefused) {
  // D_k requires D_(k-1) inside it, so a D_k nests k objects; compiled one after the other, the schema
  // stays shallow while D_129 needs more than kMaxNesting.
  json defs = {{"D0", {{"type", "string"}}}};
  json a = json::object(), b = json::object(), c = json::object();
  for (int k = 1; k <= 129; ++k) {
    defs["D" + std::to_string(k)] = {{"type", "object"},
                                     {"properties", {{"x", {{"$ref", "#/$defs/D" + std::to_string(k - 1)}}}}},
                                     {"required", {"x"}}};
    json& group = k <= 64 ? a : k <= 128 ? b : c;
    group[fmt::format("p{:03}", k)] = {{"$ref", "#/$defs/D" + std::to_string(k)}};  // compiled in order
  }
  auto with = [&](bool last) {
    json props = {{"a", {{"type", "object"}, {"properties", a}}},
                  {"b", {{"type", "object"}, {"properties", b}}}};
    if (last) props["c"] = {{"type", "object"}, {"properties", c}};
    return json{{"$defs", defs}, {"type", "object"}, {"properties", props}};
  };
  const SchemaError fits = refusal(with(false));
  EXPECT_EQ(fits.keyword, "(accepted)") << fits.what();
  const SchemaError e = refusal(with(true));
  EXPECT_EQ(e.keyword, "$ref");
  EXPECT_EQ(e.path, "#/$defs/D129");
}

TEST(JsonSchemaLimits, RequiredNestingPastTheMatchersDepthIsRefused) {
  // Objects each requiring the next: 128 fit the matcher's stack, 129 do not (a deeper max_depth than the
  // default lets the schema say so without a reference).
  auto chain = [](int objects) {
    std::string text;
    for (int i = 0; i < objects; ++i) text += R"({"type": "object", "required": ["x"], "properties": {"x": )";
    text += R"({"type": "null"})";
    for (int i = 0; i < objects; ++i) text += "}}";
    return json::parse(text);
  };
  JsonSchemaLimits limits;
  limits.max_depth = 1000;
  EXPECT_EQ(refusal(chain(kMaxNesting), limits).keyword, "(accepted)");
  EXPECT_EQ(refusal(chain(kMaxNesting + 1), limits).keyword, "max_nesting");
}

TEST(JsonSchema, ErrorsNeverEchoMuchOfTheSchema) {
  const std::string huge(100000, 'k');
  for (const json& s :
       {json{{"type", "object"}, {huge, 1}}, json{{"type", huge}},
        json{{"type", "object"}, {"properties", {{huge, {{"format", "x"}}}}}}, json{{"$ref", "#/" + huge}},
        json{{"$defs", {{huge, {{"type", "strng"}}}}}, {"$ref", "#/$defs/" + huge}},
        json{{"type", "object"}, {"properties", json::object()}, {"required", {huge}}}}) {
    const SchemaError e = refusal(s);
    EXPECT_NE(e.keyword, "(accepted)");
    EXPECT_LT(std::string(e.what()).size(), 300u) << std::string(e.what()).substr(0, 300);
  }
}

TEST(JsonSchemaNumbers, IntegerBoundsAsZodWritesThem) {
  // z.number().int() writes the safe-integer range; z.number().int().min(10).max(20) the bounds.
  auto safe = schema(R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})");
  EXPECT_TRUE(valid(safe, "0"));
  EXPECT_TRUE(valid(safe, "-9007199254740991"));
  EXPECT_EQ(rejected_at(safe, "9007199254740992"), 15u);
  EXPECT_EQ(rejected_at(safe, "90071992547409910"), 16u);
  auto s = schema(R"({"type": "integer", "minimum": 10, "maximum": 20})");
  EXPECT_TRUE(valid(s, "10"));
  EXPECT_TRUE(valid(s, "20"));
  EXPECT_TRUE(prefix_only(s, "1"));  // 1 itself is out, 1x is in
  EXPECT_TRUE(prefix_only(s, "2"));
  EXPECT_EQ(rejected_at(s, "3"), 0u);
  EXPECT_EQ(rejected_at(s, "21"), 1u);
  EXPECT_EQ(rejected_at(s, "-"), 0u);
  EXPECT_EQ(rejected_at(s, "0"), 0u);
  auto negative = schema(R"({"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": -9.5})");
  EXPECT_TRUE(valid(negative, "-10"));
  EXPECT_TRUE(valid(negative, "-19"));
  EXPECT_EQ(rejected_at(negative, "-9"), 1u);  // -9 > -9.5 and -90 < -20
  EXPECT_EQ(rejected_at(negative, "-20"), 1u);
  EXPECT_EQ(rejected_at(negative, "-0"), 1u);
}

TEST(JsonSchemaNumbers, NumberBoundsSeeThroughFractionsAndExponents) {
  auto s = schema(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})");
  EXPECT_TRUE(valid(s, "1"));
  EXPECT_TRUE(valid(s, "0.5"));
  EXPECT_TRUE(valid(s, "1.000"));
  EXPECT_TRUE(valid(s, "5e-1"));
  EXPECT_TRUE(valid(s, "1E-300"));
  EXPECT_TRUE(valid(s, "0.001e3"));
  EXPECT_TRUE(prefix_only(s, "0"));  // 0 is out, 0.5 in
  EXPECT_TRUE(prefix_only(s, "0.000"));
  EXPECT_TRUE(prefix_only(s, "1.01"));  // 1.01e-1 is in
  EXPECT_EQ(rejected_at(s, "1.01}"), 4u);
  EXPECT_TRUE(prefix_only(s, "2e"));  // 2e-1 is in
  EXPECT_EQ(rejected_at(s, "1e1"), 2u);
  EXPECT_EQ(rejected_at(s, "-"), 0u);
  EXPECT_EQ(rejected_at(s, "0e"), 1u);  // 0 with any exponent is 0
  auto big = schema(R"({"type": "number", "minimum": 1e300})");
  EXPECT_TRUE(valid(big, "1e300"));
  EXPECT_TRUE(valid(big, "2e300"));
  EXPECT_TRUE(prefix_only(big, "99"));
  EXPECT_EQ(rejected_at(big, "1e299"), 2u);  // 1e2xx is below, 1e2xxx past a double
  // Past a double's magnitudes a validator reads 0 or infinity (ajv, pydantic): not written under bounds.
  auto positive = schema(R"({"type": "number", "exclusiveMinimum": 0})");
  EXPECT_TRUE(valid(positive, "1e-300"));
  EXPECT_TRUE(valid(positive, "5e-324"));
  EXPECT_EQ(rejected_at(positive, "1e-400"), 5u);
  EXPECT_EQ(rejected_at(positive, "2e308"), 4u);
  EXPECT_EQ(rejected_at(big, "1e-"), 2u);
  auto tight = schema(R"({"type": "number", "minimum": 0.25, "maximum": 0.3})");
  EXPECT_TRUE(valid(tight, "0.3"));
  EXPECT_TRUE(valid(tight, "2.5e-1"));
  EXPECT_TRUE(valid(tight, "29e-2"));
  EXPECT_EQ(rejected_at(tight, "0.31"), 3u);
  EXPECT_EQ(rejected_at(tight, "0.30000000000000000001"), 21u);  // exact decimals, not doubles
  EXPECT_EQ(rejected_at(tight, "1"), 0u);
  EXPECT_EQ(rejected_at(tight, "2e-2"), 1u);   // no exponent puts 2 in
  EXPECT_EQ(rejected_at(tight, "24e-2"), 1u);  // no number starting 24 is in [0.25, 0.3]
}

TEST(JsonSchemaNumbers, DraftFourBooleanExclusivesAndTheTighterEnd) {
  auto s = schema(R"({"type": "number", "minimum": 1, "exclusiveMinimum": true, "maximum": 2})");
  EXPECT_TRUE(prefix_only(s, "1"));
  EXPECT_TRUE(valid(s, "1.5"));
  auto both = schema(R"({"type": "integer", "minimum": 5, "exclusiveMinimum": 5, "maximum": 7})");
  EXPECT_EQ(rejected_at(both, "5"), 0u);
  EXPECT_TRUE(valid(both, "6"));
  auto error = [](const char* text) {
    try {
      schema(text);
    } catch (const SchemaError& e) {
      return e.keyword;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(R"({"type": "integer", "minimum": 0.2, "maximum": 0.8})"), "minimum");
  EXPECT_EQ(error(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})"), "minimum");
  EXPECT_EQ(error(R"({"type": "number", "minimum": "1"})"), "minimum");
  EXPECT_EQ(error(R"({"type": "string", "maximum": 1})"), "maximum");
}

// Random walks over number bytes under random bounds: every accepted prefix can still end (never a dead
// end), every end is in bounds, and every in-range number the walk did not write is accepted whole.
TEST(JsonSchemaNumbers, RandomWalksEndInBoundsAndNumbersInBoundsAreAccepted) {
  const char* ends[] = {"-1000", "-7.5", "-1", "0", "0.001", "0.5", "3", "12.25", "99", "1e5"};
  std::mt19937 rng(5);
  const std::string alphabet = "-0123456789.eE+}";
  int ended = 0, accepted_in_range = 0;
  for (int round = 0; round < 400; ++round) {
    const bool integer = rng() % 2;
    const char* lo_text = ends[rng() % 10];
    const char* hi_text = ends[rng() % 10];
    double lo = std::stod(lo_text), hi = std::stod(hi_text);
    if (lo > hi) std::swap(lo, hi), std::swap(lo_text, hi_text);
    const bool lo_open = rng() % 2, hi_open = rng() % 2;
    const double first = lo_open ? std::floor(lo) + 1 : std::ceil(lo);
    const double last = hi_open ? std::ceil(hi) - 1 : std::floor(hi);
    if ((lo == hi && (lo_open || hi_open)) || (integer && first > last)) continue;  // no value: a 400
    const std::string text = fmt::format(
        R"({{"type": "object", "required": ["x"], "properties": {{"x": {{"type": "{}", "{}": {}, "{}": {}}}}}}})",
        integer ? "integer" : "number", lo_open ? "exclusiveMinimum" : "minimum", lo_text,
        hi_open ? "exclusiveMaximum" : "maximum", hi_text);
    SCOPED_TRACE(text);
    auto s = schema(text.c_str());
    auto in_range = [&](double v) {
      return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi) && (!integer || v == std::floor(v));
    };
    for (int walk = 0; walk < 5; ++walk) {
      JsonMatcher m(s);
      ASSERT_TRUE(m.advance("{\"x\":"));
      std::string number;
      for (int step = 0; step < 200; ++step) {
        std::string next, onward;  // onward: what moves a long number towards an end
        for (char c : alphabet)
          if (m.accepts(std::string_view(&c, 1))) next.push_back(c);
        ASSERT_FALSE(next.empty()) << "a dead end after " << number;
        if (number.size() > 12) {
          onward.clear();
          for (char c : next)
            if (c != '0' && c != '.') onward.push_back(c);
        }
        const std::string& from = number.size() > 12 && !onward.empty() ? onward : next;
        const bool close = next.find('}') != std::string::npos;
        const char c = close && (number.size() > 8 || rng() % 3 == 0) ? '}' : from[rng() % from.size()];
        ASSERT_TRUE(m.advance(std::string_view(&c, 1)));
        if (c == '}') break;
        number.push_back(c);
      }
      ASSERT_TRUE(m.can_end()) << number;
      ++ended;
      errno = 0;
      const double v = std::strtod(number.c_str(), nullptr);
      if (errno != ERANGE) {  // past double's range: not comparable here
        EXPECT_TRUE(in_range(v)) << number;
      }
    }
    // Numbers written every way: each is accepted exactly when it is in range.
    for (int k = 0; k < 20; ++k) {
      const double v = integer ? double(int(rng() % 2200) - 1100) : (double(int(rng() % 40000)) - 20000) / 16;
      for (const std::string& number :
           {fmt::format("{}", v), fmt::format("{:e}", v), fmt::format("{:.3f}", v), fmt::format("{:E}", v)}) {
        if (integer && number.find_first_of(".eE") != std::string::npos) continue;
        const bool ok = valid(s, "{\"x\": " + number + "}");
        EXPECT_EQ(ok, in_range(v)) << number;
        accepted_in_range += ok;
      }
    }
  }
  EXPECT_GT(ended, 1000);
  EXPECT_GT(accepted_in_range, 500);
}

TEST(JsonSchemaStrings, LengthsCountCodePointsWhateverTheSpelling) {
  auto s = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(valid(s, R"("ab")"));
  EXPECT_TRUE(valid(s, "\"\xC3\xA9t\xC3\xA9\""));    // 3 characters in 5 bytes
  EXPECT_TRUE(valid(s, R"("\u00e9\ud83d\ude00")"));  // an escaped pair is one character
  EXPECT_EQ(rejected_at(s, R"("a")"), 2u);
  EXPECT_EQ(rejected_at(s, R"("abcd")"), 4u);
  EXPECT_EQ(rejected_at(s, R"("ab\n\t")"), 5u);  // the fourth character, at its backslash
  auto zero = schema(R"({"type": "string", "maxLength": 0})");
  EXPECT_TRUE(valid(zero, R"("")"));
  EXPECT_EQ(rejected_at(zero, R"("a")"), 1u);
}

TEST(JsonSchemaStrings, PatternsMatchAnywhereUnlessAnchored) {
  auto anywhere = schema(R"({"type": "string", "pattern": "ab+c"})");
  EXPECT_TRUE(valid(anywhere, R"("xxabbbcyy")"));
  EXPECT_TRUE(prefix_only(anywhere, R"("xab)"));
  EXPECT_EQ(rejected_at(anywhere, R"("xx")"), 3u);  // it cannot end before ab+c appears
  auto anchored = schema(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
  EXPECT_TRUE(valid(anchored, R"("AB-123")"));
  EXPECT_EQ(rejected_at(anchored, R"("ab-123")"), 1u);
  EXPECT_EQ(rejected_at(anchored, R"("AB-1234")"), 7u);
  EXPECT_TRUE(valid(anchored, R"("\u0041B-123")"));    // an escape is the character it stands for
  EXPECT_EQ(rejected_at(anchored, R"("\u0061)"), 5u);  // \u006 can only be '`'..'o': refused at its 6
  auto unicode = schema(R"({"type": "string", "pattern": "^[^a-z]\u00e9.$"})");
  EXPECT_TRUE(valid(unicode, "\"\xF0\x9F\x98\x80\xC3\xA9x\""));
  EXPECT_EQ(rejected_at(unicode, "\"q"), 1u);
  EXPECT_EQ(rejected_at(unicode, "\"Q\xC3\xA8"), 3u);     // U+00E8, not U+00E9: refused at its last byte
  EXPECT_EQ(rejected_at(unicode, "\"Q\xE2"), 2u);         // no three-byte character is an e-acute
  EXPECT_EQ(rejected_at(unicode, "\"Q\xC3\xA9\\n"), 5u);  // '.' is not a line terminator
}

TEST(JsonSchemaStrings, PatternsWithLengthsAreExact) {
  // (ab)* has only even lengths: with minLength 3 and maxLength 4, only "abab".
  auto s = schema(R"({"type": "string", "pattern": "^(ab)*$", "minLength": 3, "maxLength": 4})");
  EXPECT_TRUE(valid(s, R"("abab")"));
  EXPECT_EQ(rejected_at(s, R"("ab")"), 3u);
  EXPECT_EQ(rejected_at(s, R"("ababa)"), 5u);
  auto error = [](const char* text) {
    try {
      schema(text);
    } catch (const SchemaError& e) {
      return e.keyword;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(R"({"type": "string", "pattern": "^(ab)*$", "minLength": 3, "maxLength": 3})"), "pattern");
  EXPECT_EQ(error(R"({"type": "string", "pattern": "a^"})"), "pattern");  // no string at all
  EXPECT_EQ(error(R"({"type": "string", "pattern": "(?=a)b"})"), "pattern");
  EXPECT_EQ(error(R"({"type": "string", "pattern": "(a)\\1"})"), "pattern");
  EXPECT_EQ(error(R"({"type": "string", "pattern": "\\bword"})"), "pattern");
  EXPECT_EQ(error(R"({"type": "string", "pattern": "(a"})"), "pattern");
  EXPECT_EQ(error(R"({"type": "string", "pattern": "(a|b)*a(a|b){20}"})"), "pattern");  // 2^20 states
  EXPECT_EQ(error(R"({"type": "string", "format": "hostname-ish"})"), "format");
  EXPECT_EQ(error(R"({"type": "integer", "minLength": 1})"), "minLength");
}

TEST(JsonSchemaStrings, EnumValuesThatFailTheOtherKeywordsAreLeftOut) {
  auto s = schema(R"({"type": "string", "enum": ["a", "bb", "ccc"], "minLength": 2})");
  EXPECT_EQ(rejected_at(s, R"("a")"), 1u);
  EXPECT_TRUE(valid(s, R"("bb")"));
  auto n = schema(R"({"type": "integer", "enum": [1, 5, 9], "maximum": 5})");
  EXPECT_EQ(rejected_at(n, "9"), 0u);
  EXPECT_TRUE(valid(n, "5"));
}

TEST(JsonSchemaFormats, DatesAreCalendarDays) {
  auto s = schema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(valid(s, R"("2024-02-29")"));
  EXPECT_TRUE(valid(s, R"("2000-02-29")"));
  EXPECT_TRUE(valid(s, R"("1999-12-31")"));
  EXPECT_EQ(rejected_at(s, R"("2023-02-29")"), 10u);
  EXPECT_EQ(rejected_at(s, R"("1900-02-29")"), 10u);
  EXPECT_EQ(rejected_at(s, R"("2024-04-31")"), 10u);
  EXPECT_EQ(rejected_at(s, R"("2024-13-01")"), 7u);
  EXPECT_EQ(rejected_at(s, R"("2024-1-01")"), 7u);
}

TEST(JsonSchemaFormats, TimesDateTimesUuidsEmailsUris) {
  auto t = schema(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(valid(t, R"("2024-05-06T07:08:09Z")"));
  EXPECT_TRUE(valid(t, R"("2024-05-06t07:08:09.123+05:30")"));
  EXPECT_TRUE(valid(t, R"("2024-05-06 23:59:60z")"));
  EXPECT_EQ(rejected_at(t, R"("2024-05-06T07:08:09")"), 20u);  // a zone is required
  EXPECT_EQ(rejected_at(t, R"("2024-05-06T24:00:00Z")"), 13u);
  auto u = schema(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(valid(u, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(valid(u, R"("urn:uuid:123E4567-E89B-12D3-A456-426614174000")"));
  EXPECT_EQ(rejected_at(u, R"("123e4567-e89b-12d3-a456-42661417400")"), 36u);
  auto e = schema(R"({"type": "string", "format": "email"})");
  EXPECT_TRUE(valid(e, R"("ann.lee+tag@mail.example.com")"));
  EXPECT_EQ(rejected_at(e, R"("ann@example")"), 12u);  // at least one dot in the domain
  EXPECT_EQ(rejected_at(e, R"("ann@-x.com")"), 5u);
  auto uri = schema(R"({"type": "string", "format": "uri"})");
  EXPECT_TRUE(valid(uri, R"("https://user@example.com:8080/a/b?q=1#frag")"));
  EXPECT_TRUE(valid(uri, R"("mailto:ann@example.com")"));
  EXPECT_TRUE(valid(uri, R"("http://[2001:db8::1]/")"));
  EXPECT_EQ(rejected_at(uri, R"("example.com/a")"), 12u);  // no scheme
  EXPECT_EQ(rejected_at(uri, R"("http://a b")"), 9u);
}

TEST(JsonSchemaArrays, PrefixItemsThenItems) {
  auto s = schema(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                      "items": {"type": "boolean"}})");
  EXPECT_TRUE(valid(s, R"(["a", 1, true, false])"));
  EXPECT_TRUE(valid(s, R"(["a"])"));
  EXPECT_EQ(rejected_at(s, R"([1])"), 1u);
  EXPECT_EQ(rejected_at(s, R"(["a", 1, 2])"), 9u);
  auto closed =
      schema(R"({"type": "array", "prefixItems": [{"type": "string"}], "items": false, "minItems": 1})");
  EXPECT_EQ(rejected_at(closed, R"(["a", "b"])"), 4u);
  EXPECT_EQ(rejected_at(closed, "[]"), 1u);
  // zod-to-json-schema's tuples (draft 7): items as an array, additionalItems for the rest.
  auto tuple = schema(R"({"type": "array", "items": [{"type": "number"}, {"type": "null"}], "minItems": 2,
                          "maxItems": 2})");
  EXPECT_TRUE(valid(tuple, "[1.5, null]"));
  EXPECT_EQ(rejected_at(tuple, "[1.5]"), 4u);
}

TEST(JsonRegex, WholeOutputRegexAndChoice) {
  auto r = JsonSchema::regex("(yes|no)( [0-9]+)?");
  EXPECT_TRUE(valid(r, "yes"));
  EXPECT_TRUE(valid(r, "no 42"));
  EXPECT_TRUE(prefix_only(r, "no "));
  EXPECT_EQ(rejected_at(r, "maybe"), 0u);
  EXPECT_EQ(rejected_at(r, "yes!"), 3u);  // a whole match, not a search
  auto c = JsonSchema::choice({"red", "green", "a.b", "\xC3\xA9t\xC3\xA9"});
  EXPECT_TRUE(valid(c, "green"));
  EXPECT_TRUE(valid(c, "a.b"));
  EXPECT_TRUE(valid(c, "\xC3\xA9t\xC3\xA9"));
  EXPECT_EQ(rejected_at(c, "axb"), 1u);  // '.' is a character here, not any character
  EXPECT_EQ(rejected_at(c, "re"), 2u);
  EXPECT_FALSE(valid(c, "re"));
  EXPECT_THROW(JsonSchema::regex("a(?!b)"), SchemaError);
  EXPECT_THROW(JsonSchema::choice({}), SchemaError);
}

TEST(JsonSchemaStrings, ZodFormatsWithPatternsPassBothAndLeadingLookaheadsHold) {
  // zod 4's z.email(): a format and a pattern with two leading lookaheads (no leading dot, no "..").
  auto email = schema(R"({"type": "string", "format": "email",
      "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})");
  EXPECT_TRUE(valid(email, R"("ann.lee@example.com")"));
  EXPECT_EQ(rejected_at(email, R"(".ann@example.com")"), 1u);
  EXPECT_EQ(rejected_at(email, R"("ann..lee@example.com")"), 5u);
  EXPECT_EQ(rejected_at(email, R"("ann@example.c")"), 14u);  // the pattern wants two letters at the end
  // zod 4's z.uuid() pattern is narrower than the format: a version digit 1-8.
  auto uuid = schema(R"({"type": "string", "format": "uuid",
      "pattern": "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12})$"})");
  EXPECT_TRUE(valid(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_EQ(rejected_at(uuid, R"("123e4567-e89b-92d3-a456-426614174000")"), 15u);
  EXPECT_EQ(rejected_at(uuid, R"("urn:uuid:123e4567-e89b-12d3-a456-426614174000")"),
            1u);  // the format's prefix, not the pattern's
  // zod's records write propertyNames {"type": "string"}: keys are strings anyway.
  auto record = schema(
      R"({"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(valid(record, R"({"a": true, "b": false})"));
  EXPECT_THROW(schema(R"({"type": "object", "propertyNames": {"pattern": "^a"}})"), SchemaError);
}

std::shared_ptr<const JsonSchema> call(JsonSchema::CallFormat format, bool name_written,
                                       std::vector<std::pair<const char*, const char*>> functions) {
  std::vector<JsonSchema::Function> f;
  for (auto [name, parameters] : functions) f.push_back({name, json::parse(parameters)});
  return JsonSchema::tool_call(f, format, name_written);
}
constexpr auto kHermes = JsonSchema::CallFormat::kHermes;
constexpr auto kXml = JsonSchema::CallFormat::kQwenXml;

// A forced hermes tool call: the arguments, then "}\n</tool_call>" before the document may end.
TEST(ToolCall, HermesArgumentsThenTheCallsEnd) {
  auto c = call(
      kHermes, true,
      {{"f",
        R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]})"}});
  EXPECT_TRUE(valid(c, "{\"n\": 3}}\n</tool_call>"));
  EXPECT_TRUE(valid(c, "{\"n\": 3} }\n</tool_call>"));  // whitespace before the suffix, not inside it
  EXPECT_TRUE(prefix_only(c, "{\"n\": 3}"));
  EXPECT_TRUE(prefix_only(c, "{\"n\": 3}}\n</tool"));
  EXPECT_EQ(rejected_at(c, "{\"n\": 3}} "), 9u);
  EXPECT_EQ(rejected_at(c, "{\"n\": 3}}\n</tool_call>\n"), 22u);
  EXPECT_EQ(rejected_at(c, "{\"n\": 0}"), 6u);
}

// "required" over several tools: the name is one of theirs, and the arguments are that function's.
TEST(ToolCall, HermesChoosesAmongTheFunctions) {
  auto c =
      call(kHermes, false,
           {{"get", R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})"},
            {"get_all", R"({"type": "object", "properties": {"tag": {"type": "string"}}})"}});
  EXPECT_TRUE(valid(c, "get\", \"arguments\": {\"id\": 4}}\n</tool_call>"));
  EXPECT_TRUE(valid(c, "get_all\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_EQ(rejected_at(c, "get_all\", \"arguments\": {\"id\""), 25u);  // not get_all's parameter
  EXPECT_EQ(rejected_at(c, "get\", \"arguments\": {}"), 20u);           // get's id is required
  EXPECT_EQ(rejected_at(c, "put\""), 0u);
  EXPECT_EQ(rejected_at(c, "get_x"), 4u);
}

// Qwen3.5's XML parameters: each at most once, in any order, required ones before </function>; strings as
// raw text (with newlines, never '<'), other types as JSON text with nothing around it.
TEST(ToolCall, QwenXmlParameters) {
  auto c = call(kXml, true, {{"f", R"({"type": "object", "properties": {
      "city": {"type": "string", "minLength": 2},
      "days": {"type": "integer", "minimum": 1, "maximum": 14},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
      "tags": {"type": "array", "items": {"type": "boolean"}}}, "required": ["city"]})"}});
  EXPECT_TRUE(valid(c, "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(valid(c,
                    "<parameter=days>\n3\n</parameter>\n<parameter=city>\nNew\nYork\n\n</parameter>\n"
                    "<parameter=unit>\ncelsius\n</parameter>\n<parameter=tags>\n[true, false]\n</parameter>\n"
                    "</function></tool_call>"));
  EXPECT_EQ(rejected_at(c, "</function>"), 1u);              // city is required
  EXPECT_EQ(rejected_at(c, "<parameter=city>\nP\n<"), 19u);  // too short to end
  EXPECT_EQ(rejected_at(c, "<parameter=city>\na<b"), 18u);   // no '<' in a value
  EXPECT_EQ(rejected_at(c, "<parameter=days>\n15"), 18u);
  EXPECT_EQ(rejected_at(c, "<parameter=days>\n 3"), 17u);  // the parser would keep the space
  EXPECT_EQ(rejected_at(c, "<parameter=unit>\nkelvin"), 17u);
  EXPECT_EQ(rejected_at(c, "<parameter=city>\nParis\n</parameter>\n<parameter=city>"), 47u);  // once
  EXPECT_TRUE(prefix_only(c, "<parameter=city>\nParis\n</parameter>\n</function>"));
  EXPECT_EQ(rejected_at(c, "<parameter=zip>"), 11u);
}

TEST(ToolCall, QwenXmlChoosesAmongTheFunctions) {
  auto c = call(kXml, false,
                {{"a", R"({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]})"},
                 {"b", R"({"properties": {}})"}});
  EXPECT_TRUE(valid(c, "a>\n<parameter=x>\n-1.5e3\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(valid(c, "b>\n</function>\n</tool_call>"));
  EXPECT_EQ(rejected_at(c, "a>\n</"), 4u);
  EXPECT_EQ(rejected_at(c, "c"), 0u);
}

// What the format cannot carry exactly is refused by name: the parser would read the text otherwise.
TEST(ToolCall, QwenXmlRefusesWhatItCannotWrite) {
  EXPECT_THROW(call(kXml, true, {{"f", R"({"type": "string"})"}}), SchemaError);
  EXPECT_THROW(call(kXml, true, {{"f", R"({"type": "object", "properties": {"a<b": {"type": "string"}}})"}}),
               SchemaError);
  EXPECT_THROW(
      call(kXml, true,
           {{"f", R"({"type": "object", "properties": {"p": {"type": "string", "pattern": "^<$"}}})"}}),
      SchemaError);
  EXPECT_THROW(call(kXml, false, {{"f>", R"({"type": "object"})"}}), SchemaError);
  // An enum of numbers with no type: the parser keeps the text a string.
  EXPECT_THROW(call(kXml, true, {{"f", R"({"type": "object", "properties": {"n": {"enum": [1, 2]}}})"}}),
               SchemaError);
  try {
    call(kXml, true,
         {{"lookup", R"({"type": "object", "properties": {"n": {"type": "integer", "not": {}}}})"}});
    ADD_FAILURE();
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword, "not");
    EXPECT_NE(std::string(e.what()).find("lookup"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve
