#include "common/bounded_json.h"

#include <gtest/gtest.h>

#include <string>

namespace moeserve {
namespace {

using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

std::string nested_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string nested_objects(size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

std::string wide_object(size_t members) {
  std::string s = "{";
  for (size_t i = 0; i < members; ++i)
    s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return s + "}";
}

TEST(BoundedJson, EqualsNlohmannOnOrdinaryDocuments) {
  const char* docs[] = {
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"n":1,"stop":null})",
      R"([1,-2,3.5,"x",true,false,null,{},[],{"z":{"y":[{"x":1}]}}])",
      R"("just a string")",
      R"(18446744073709551615)",
      R"({"b":1,"a":2,"c":{"2":0,"1":[0]}})",
  };
  for (const char* d : docs) {
    EXPECT_EQ(parse_bounded_json<ordered_json>(d), ordered_json::parse(d)) << d;
    EXPECT_EQ(parse_bounded_json<json>(d), json::parse(d)) << d;
    // Member order is the document's for ordered_json.
    EXPECT_EQ(parse_bounded_json<ordered_json>(d).dump(), ordered_json::parse(d).dump()) << d;
  }
}

TEST(BoundedJson, DuplicateKeysKeepTheFirstPositionAndTheLastValueLikeNlohmann) {
  const std::string small = R"({"a":1,"b":2,"a":3})";
  EXPECT_EQ(parse_bounded_json<ordered_json>(small).dump(), ordered_json::parse(small).dump());
  // Past the linear-scan size the hash index decides, with the same result.
  std::string wide = wide_object(40);
  wide.back() = ',';
  wide += R"("k3":"again","k39":"last"})";
  EXPECT_EQ(parse_bounded_json<ordered_json>(wide).dump(), ordered_json::parse(wide).dump());
  EXPECT_EQ(parse_bounded_json<json>(wide), json::parse(wide));
}

TEST(BoundedJson, DepthLimitHoldsAtTheLimitAndRefusesBeyondIt) {
  JsonLimits limits;
  limits.max_depth = 10;
  EXPECT_NO_THROW(parse_bounded_json<ordered_json>(nested_arrays(10), limits));
  EXPECT_NO_THROW(parse_bounded_json<ordered_json>(nested_objects(10), limits));
  try {
    parse_bounded_json<ordered_json>(nested_arrays(11), limits);
    FAIL() << "11 levels were accepted";
  } catch (const JsonParseError& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than 10 levels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_bounded_json<json>(nested_objects(11), limits), JsonParseError);
}

TEST(BoundedJson, HundredThousandLevelsAreRefusedWithoutRecursion) {
  // The default limit stops this long before any stack is at risk; the parse itself is iterative.
  const std::string deep = nested_arrays(100000);
  EXPECT_THROW(parse_bounded_json<ordered_json>(deep), JsonParseError);
  EXPECT_TRUE(parse_bounded_json_or_discarded<ordered_json>(nested_objects(100000)).is_discarded());
  // A document just inside the default limit is whole.
  auto ok = parse_bounded_json<ordered_json>(nested_objects(JsonLimits{}.max_depth));
  EXPECT_TRUE(ok.contains("a"));
}

TEST(BoundedJson, MemberItemAndValueCountsAreLimited) {
  JsonLimits limits;
  limits.max_object_members = 100;
  limits.max_array_items = 50;
  limits.max_values = 1000;
  EXPECT_EQ(parse_bounded_json<ordered_json>(wide_object(100), limits).size(), 100u);
  EXPECT_THROW(parse_bounded_json<ordered_json>(wide_object(101), limits), JsonParseError);
  // Duplicates do not count twice.
  EXPECT_NO_THROW(parse_bounded_json<ordered_json>(R"({"a":1,"a":2,"a":3})", limits));
  std::string items = "[0";
  for (int i = 1; i < 51; ++i) items += ",0";
  EXPECT_THROW(parse_bounded_json<json>(items + "]", limits), JsonParseError);
  std::string many = "[";
  for (int i = 0; i < 40; ++i)
    many += std::string(i ? "," : "") + "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]";
  EXPECT_THROW(parse_bounded_json<json>(many + "]", limits), JsonParseError);
}

TEST(BoundedJson, ManyKeysBuildTheSameDocumentAsNlohmann) {
  // 20,000 members: nlohmann's ordered_json does 2*10^8 key comparisons here; this is linear.
  const std::string wide = wide_object(20000);
  auto parsed = parse_bounded_json<ordered_json>(wide);
  ASSERT_EQ(parsed.size(), 20000u);
  EXPECT_EQ(parsed.begin().key(), "k0");
  EXPECT_EQ(parsed["k19999"], 19999);
}

TEST(BoundedJson, SyntaxErrorsNameThePositionAndNotTheInput) {
  const std::string secret(5000, 'x');
  try {
    parse_bounded_json<ordered_json>("{\"a\": " + secret);
    FAIL();
  } catch (const JsonParseError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("parse error"), std::string::npos) << what;
    EXPECT_LT(what.size(), 400u) << what;
  }
  try {
    parse_bounded_json<json>("[\"" + secret);  // an unterminated string is nlohmann's "last read" token
    FAIL();
  } catch (const JsonParseError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
  }
  EXPECT_THROW(parse_bounded_json<json>("{} trailing"), JsonParseError);
  EXPECT_THROW(parse_bounded_json<json>(""), JsonParseError);
  EXPECT_TRUE(parse_bounded_json_or_discarded<json>("[1,]").is_discarded());
}

}  // namespace
}  // namespace moeserve
