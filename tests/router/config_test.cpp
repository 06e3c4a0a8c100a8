#include "router/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "router/request_info.h"

namespace moeserve::router {
namespace {

using namespace std::chrono_literals;

TEST(RouterConfig, ParsesDurationsLikeNginx) {
  EXPECT_EQ(parse_duration("30s"), 30s);
  EXPECT_EQ(parse_duration("30"), 30s);
  EXPECT_EQ(parse_duration("250ms"), 250ms);
  EXPECT_EQ(parse_duration("5m"), 300s);
  EXPECT_THROW(parse_duration("soon"), Error);
  EXPECT_THROW(parse_duration("3 days"), Error);
}

TEST(RouterConfig, ParsesBackendUrls) {
  auto a = parse_backend_url("http://10.0.0.7:30000");
  EXPECT_EQ(a.host, "10.0.0.7");
  EXPECT_EQ(a.port, 30000);
  EXPECT_EQ(a.prefix, "");
  auto b = parse_backend_url("http://node3/api/");
  EXPECT_EQ(b.host, "node3");
  EXPECT_EQ(b.port, 80);
  EXPECT_EQ(b.prefix, "/api");
  auto c = parse_backend_url("[::1]:8080");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 8080);
  EXPECT_THROW(parse_backend_url("https://x"), Error);
  EXPECT_THROW(parse_backend_url("http://x:99999"), Error);
}

TEST(RouterConfig, ReadsAClusterFileInYaml) {
  auto config = parse_config(R"(
router:
  port: 8100
  policy: cache_aware
  max-fails: 5
  fail_timeout: 10s
  keepalive: 16
  cache_threshold: 0.5
  max_connections: 100
  max_body_memory: 100000000
backends:
  - http://10.0.0.1:30000
  - url: http://10.0.0.2:30000
    weight: 2
    models: [qwen3.5-35b-a3b]
)",
                             "yaml", "cluster.yaml");
  EXPECT_EQ(config.port, 8100);
  EXPECT_EQ(config.policy, Policy::cache_aware);
  EXPECT_EQ(config.max_fails, 5);
  EXPECT_EQ(config.fail_timeout, 10s);
  EXPECT_EQ(config.keepalive, 16);
  EXPECT_DOUBLE_EQ(config.cache_threshold, 0.5);
  EXPECT_EQ(config.max_connections, 100);
  EXPECT_EQ(config.max_body_memory, 100'000'000u);
  ASSERT_EQ(config.backends.size(), 2u);
  EXPECT_EQ(config.backends[1].weight, 2);
  EXPECT_EQ(config.backends[1].models, std::vector<std::string>{"qwen3.5-35b-a3b"});
  validate(config);
}

TEST(RouterConfig, ReadsJsonAndRejectsUnknownKeys) {
  auto config = parse_config(R"({"policy": "round_robin", "backends": ["http://a:1"]})", "json", "c.json");
  EXPECT_EQ(config.policy, Policy::round_robin);
  try {
    parse_config("polcy: least_conn\n", "yaml", "cluster.yaml");
    FAIL() << "a misspelt key must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("polcy"), std::string::npos);
  }
  EXPECT_THROW(validate(RouterConfig{}), Error);  // no backends
  RouterConfig small_budget = config;
  small_budget.max_body_memory = small_budget.max_body_bytes - 1;
  EXPECT_THROW(validate(small_budget), Error) << "the budget must hold one body of the largest size";
}

TEST(RequestInfo, RendersChatMessagesSoTurnsSharePrefixes) {
  KeyEncoder bytes;
  BodyNeeds needs{.key = true, .session = true};
  auto turn1 = describe_request(
      R"({"model":"m","user":"u1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]})",
      "", needs, bytes);
  auto turn2 = describe_request(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":"hello"},{"role":"user","content":[{"type":"text","text":"more"}]}]})",
      "s9", needs, bytes);
  std::string text1(turn1.key.begin(), turn1.key.end());
  std::string text2(turn2.key.begin(), turn2.key.end());
  EXPECT_EQ(text1, "system\nbe brief\nuser\nhi\n");
  EXPECT_EQ(text2.substr(0, text1.size()), text1);
  EXPECT_EQ(turn1.model, "m");
  EXPECT_EQ(turn1.session, "u1");
  EXPECT_EQ(turn2.session, "s9");  // the header wins over the body
  auto ids = describe_request(R"({"prompt":[1,2,3]})", "", needs, bytes);
  EXPECT_EQ(ids.key, (std::vector<uint32_t>{1, 2, 3}));
  auto junk = describe_request("not json", "", needs, bytes);
  EXPECT_TRUE(junk.key.empty());
}

// The Responses API: the response a request continues, and the id an answer carries (in a stream, the
// first event's response; the items' own ids and ids quoted inside strings are not it).
TEST(RequestInfo, ResponseIdsOfRequestsAndAnswers) {
  KeyEncoder bytes;
  BodyNeeds needs{.response = true};
  EXPECT_EQ(describe_request(R"({"input":"hi","previous_response_id":"resp_1a"})", "", needs, bytes)
                .previous_response,
            "resp_1a");
  EXPECT_EQ(
      describe_request(R"({"input":"hi","previous_response_id":null})", "", needs, bytes).previous_response,
      "");
  EXPECT_EQ(describe_request(R"({"input":"hi","previous_response_id":"resp_1a"})", "", BodyNeeds{}, bytes)
                .previous_response,
            "");
  EXPECT_EQ(response_id_in(R"({"id":"resp_0f3a","object":"response","output":[{"id":"msg_1"}]})"),
            "resp_0f3a");
  EXPECT_EQ(
      response_id_in("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
                     "\"response\":{\"id\" : \"resp_Ab-9\",\"status\":\"in_progress\"}}\n\n"),
      "resp_Ab-9");
  EXPECT_EQ(response_id_in(
                R"({"instructions":"say \"id\":\"resp_fake\"","output":[{"id":"msg_1"}],"id":"resp_2"})"),
            "resp_2");
  EXPECT_EQ(response_id_in(R"({"id":"resp_cut)"), std::nullopt);  // the rest comes in the next chunk
  EXPECT_EQ(response_id_in(R"({"error":{"message":"no"}})"), std::nullopt);

  // The stored-response endpoints name the response in their path.
  EXPECT_EQ(response_id_in_path("/v1/responses/resp_1a"), "resp_1a");
  EXPECT_EQ(response_id_in_path("/v1/responses/resp_1a/input_items?limit=2&after=msg_1"), "resp_1a");
  EXPECT_EQ(response_id_in_path("/v1/responses/resp_1a/cancel"), "resp_1a");
  EXPECT_EQ(response_id_in_path("/v1/responses/resp_1a?stream=false"), "resp_1a");
  EXPECT_EQ(response_id_in_path("/v1/responses"), std::nullopt);
  EXPECT_EQ(response_id_in_path("/v1/responses/"), std::nullopt);
  EXPECT_EQ(response_id_in_path("/v1/responses?x=/v1/responses/resp_1"), std::nullopt);
  EXPECT_EQ(response_id_in_path("/v1/chat/completions"), std::nullopt);
}

// An image is a short digest of its URL in the key: the same image (a data: URL's bytes) in the next turn
// keeps the conversation's prefix, a different one of the same size parts at once, and a large one stays
// short.
TEST(RequestInfo, ImagesKeyByADigestOfTheirBytes) {
  KeyEncoder bytes;
  BodyNeeds needs{.key = true};
  auto chat = [&](const std::string& url, const std::string& more) {
    nlohmann::json body = {{"messages",
                            {{{"role", "user"},
                              {"content",
                               {{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                {{"type", "text"}, {"text", "what?"}}}}}}}};
    if (!more.empty()) body["messages"].push_back({{"role", "user"}, {"content", more}});
    auto key = describe_request(body.dump(), "", needs, bytes).key;
    return std::string(key.begin(), key.end());
  };
  const std::string a = "data:image/png;base64," + std::string(1 << 20, 'A');
  const std::string b = "data:image/png;base64," + std::string(1 << 20, 'B');
  const std::string first = chat(a, "");
  EXPECT_LT(first.size(), 100u) << "a 1 MB image is a short digest in the key";
  EXPECT_EQ(chat(a, "and then?").substr(0, first.size()), first);
  const std::string other = chat(b, "");
  EXPECT_EQ(other.size(), first.size());
  EXPECT_NE(other, first);
  // The Responses API's input_image (image_url a string) and Anthropic's base64 source key the same way.
  auto responses = describe_request(
      R"({"messages":[{"role":"user","content":[{"type":"input_image","image_url":")" + a + R"("}]}]})", "",
      needs, bytes);
  auto anthropic = describe_request(
      R"({"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"x"}}]}]})",
      "", needs, bytes);
  EXPECT_LT(responses.key.size(), 100u);
  EXPECT_LT(anthropic.key.size(), 100u);
  EXPECT_NE(std::string(anthropic.key.begin(), anthropic.key.end()).find("<image "), std::string::npos);
}

// Bodies from clients are parsed with limits: nesting or key counts beyond them are an error (a 400 from the
// router) rather than a crash or seconds of work; fields of unexpected types are ignored.
TEST(RequestInfo, RefusesJsonBeyondTheLimitsAndIgnoresFieldsOfOtherTypes) {
  KeyEncoder bytes;
  BodyNeeds needs{.key = true, .session = true, .model = true};
  std::string deep = R"({"messages":[{"role":"user","content":"hi"}],"tools":)" + std::string(100'000, '[') +
                     std::string(100'000, ']') + "}";
  EXPECT_THROW(describe_request(deep, "", needs, bytes), JsonParseError);
  std::string keys = "{";
  for (int i = 0; i < 100'000; ++i) keys += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
  keys += "}";
  EXPECT_THROW(describe_request(keys, "", needs, bytes), JsonParseError);
  EXPECT_THROW(describe_request(R"({"messages": [)", "", needs, bytes), JsonParseError);
  auto odd = describe_request(
      R"({"model":1,"user":[],"messages":[{"role":2,"content":[{"image_url":{"url":3}},{"text":4}]},5]})", "",
      needs, bytes);
  EXPECT_TRUE(odd.model.empty());
  EXPECT_TRUE(odd.session.empty());
  std::string text(odd.key.begin(), odd.key.end());
  EXPECT_EQ(text.substr(0, 8), "\n<image ") << text;  // an image whatever its URL's type
  EXPECT_EQ(text.back(), '\n');
}

TEST(RequestInfo, ReadsLoadReportedByServers) {
  auto vllm = parse_reported_load(
      "# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name=\"m\"} 3.0\n"
      "vllm:num_requests_waiting{model_name=\"m\"} 2.0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n");
  EXPECT_DOUBLE_EQ(vllm.requests, 5);
  EXPECT_DOUBLE_EQ(vllm.kv_usage, 0.25);
  auto none = parse_reported_load("other_metric 1\n");
  EXPECT_LT(none.requests, 0);
  EXPECT_EQ(parse_retry_after("7"), 7.0);
  EXPECT_FALSE(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT").has_value());
}

}  // namespace
}  // namespace moeserve::router

namespace moeserve::router {
namespace {

TEST(RequestInfo, KeysAreTokenIdsWithATokenizer) {
  const std::string path = ".cache/tokenizer-qwen3/tokenizer.json";
  ASSERT_TRUE(std::ifstream(path).good()) << path << " is missing: run scripts/fetch-test-data.sh first";
  auto tokens = make_key_encoder(path);
  BodyNeeds needs{.key = true, .session = false, .model = false};
  auto turn1 = describe_request(R"({"messages":[{"role":"user","content":"Tell me about the sea."}]})", "",
                                needs, *tokens);
  auto turn2 = describe_request(
      R"({"messages":[{"role":"user","content":"Tell me about the sea."},{"role":"assistant","content":"It is big."}]})",
      "", needs, *tokens);
  std::string text = "user\nTell me about the sea.\n";
  ASSERT_FALSE(turn1.key.empty());
  EXPECT_LT(turn1.key.size(), text.size()) << "expected token ids, not bytes";
  ASSERT_LT(turn1.key.size(), turn2.key.size());
  EXPECT_TRUE(std::equal(turn1.key.begin(), turn1.key.end(), turn2.key.begin()));
}

}  // namespace
}  // namespace moeserve::router
