// The Responses API's store and its endpoints (GET/DELETE /v1/responses/{id}, input_items, cancel), called
// as the service calls them: a request's method, path and query over a store.
#include "server/response_store.h"

#include <gtest/gtest.h>

#include "server/api_error.h"

namespace moeserve::server {
namespace {

using json = nlohmann::ordered_json;

StoredResponse response_with_items(const std::string& id, int n_items) {
  StoredResponse r;
  r.response = {{"id", id}, {"object", "response"}, {"status", "completed"}, {"output", json::array()}};
  r.input_items = json::array();
  for (int i = 0; i < n_items; ++i)
    r.input_items.push_back({{"id", "msg_" + std::to_string(i)}, {"type", "message"}, {"role", "user"}});
  r.messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  return r;
}

HttpRequest request(const std::string& method, const std::string& path, const std::string& query = "") {
  HttpRequest r;
  r.method = method;
  r.path = path;
  r.query = query;
  return r;
}

// What the endpoint answers: the body of a 2xx, or the ApiError's status and param.
struct Answer {
  int status;
  json body;
  std::string param;
};
Answer call(ResponseStore& store, const std::string& method, const std::string& path,
            const std::string& query = "") {
  const std::string prefix = "/v1/responses/";
  try {
    HttpResponse r = stored_response_request(store, request(method, path, query), path.substr(prefix.size()));
    return {r.status, json::parse(r.body), ""};
  } catch (const ApiError& e) {
    return {e.status, json(), e.param.value_or("")};
  }
}

std::vector<std::string> ids_of(const json& page) {
  std::vector<std::string> ids;
  for (const json& item : page["data"]) ids.push_back(item["id"]);
  return ids;
}

TEST(ResponseStore, KeepsTheLatestWithinItsBoundsAndErases) {
  ResponseStore store(/*max_entries=*/2);
  store.put("resp_a", response_with_items("resp_a", 1));
  store.put("resp_b", response_with_items("resp_b", 1));
  store.put("resp_c", response_with_items("resp_c", 1));
  EXPECT_EQ(store.get("resp_a"), nullptr);  // the oldest went first
  ASSERT_NE(store.get("resp_b"), nullptr);
  EXPECT_EQ(store.get("resp_b")->response["id"], "resp_b");
  EXPECT_TRUE(store.erase("resp_b"));
  EXPECT_FALSE(store.erase("resp_b"));
  EXPECT_EQ(store.get("resp_b"), nullptr);
  EXPECT_EQ(store.size(), 1u);

  // The byte bound counts the response, its items and its conversation.
  const size_t one = response_with_items("resp_x", 50).response.dump().size() +
                     response_with_items("resp_x", 50).input_items.dump().size() +
                     response_with_items("resp_x", 50).messages.dump().size();
  ResponseStore small(100, one + one / 2);
  small.put("resp_x", response_with_items("resp_x", 50));
  small.put("resp_y", response_with_items("resp_y", 50));
  EXPECT_EQ(small.get("resp_x"), nullptr);
  EXPECT_NE(small.get("resp_y"), nullptr);
  ResponseStore tiny(100, 10);
  tiny.put("resp_x", response_with_items("resp_x", 1));  // larger than the whole store: not kept
  EXPECT_EQ(tiny.size(), 0u);
}

TEST(ResponseStore, RetrieveDeleteAndCancelAnswerAsOpenAi) {
  ResponseStore store;
  store.put("resp_a", response_with_items("resp_a", 1));
  Answer got = call(store, "GET", "/v1/responses/resp_a");
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, store.get("resp_a")->response);

  Answer cancel = call(store, "POST", "/v1/responses/resp_a/cancel");
  EXPECT_EQ(cancel.status, 400);  // only background responses can be cancelled
  EXPECT_EQ(call(store, "POST", "/v1/responses/resp_nope/cancel").status, 404);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_a", "stream=true").param, "stream");

  Answer deleted = call(store, "DELETE", "/v1/responses/resp_a");
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(deleted.body, (json{{"id", "resp_a"}, {"object", "response"}, {"deleted", true}}));
  for (const char* method : {"GET", "DELETE"}) {
    Answer gone = call(store, method, "/v1/responses/resp_a");
    EXPECT_EQ(gone.status, 404) << method;
    EXPECT_EQ(gone.param, "response_id") << method;
  }
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_a/input_items").status, 404);

  // A wrong method is a 405 whatever the id; an unknown sub-path is no route.
  EXPECT_EQ(call(store, "PUT", "/v1/responses/resp_nope").status, 405);
  EXPECT_EQ(call(store, "POST", "/v1/responses/resp_nope").status, 405);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_nope/cancel").status, 405);
  EXPECT_EQ(call(store, "DELETE", "/v1/responses/resp_nope/input_items").status, 405);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_a/outputs").status, 404);
  EXPECT_EQ(call(store, "GET", "/v1/responses/").status, 404);
}

TEST(ResponseStore, InputItemsArePagedNewestFirstByDefault) {
  ResponseStore store;
  store.put("resp_a", response_with_items("resp_a", 5));
  Answer all = call(store, "GET", "/v1/responses/resp_a/input_items");
  ASSERT_EQ(all.status, 200);
  EXPECT_EQ(all.body["object"], "list");
  EXPECT_EQ(ids_of(all.body), (std::vector<std::string>{"msg_4", "msg_3", "msg_2", "msg_1", "msg_0"}));
  EXPECT_EQ(all.body["first_id"], "msg_4");
  EXPECT_EQ(all.body["last_id"], "msg_0");
  EXPECT_EQ(all.body["has_more"], false);

  // Pages of two, oldest first, each after the last id of the one before (the SDK's cursor).
  std::vector<std::string> walked;
  std::string query = "order=asc&limit=2";
  for (int page = 0; page < 5; ++page) {
    Answer a = call(store, "GET", "/v1/responses/resp_a/input_items", query);
    ASSERT_EQ(a.status, 200);
    for (auto& id : ids_of(a.body)) walked.push_back(id);
    if (!a.body["has_more"].get<bool>()) break;
    query = "order=asc&limit=2&after=" + a.body["last_id"].get<std::string>();
  }
  EXPECT_EQ(walked, (std::vector<std::string>{"msg_0", "msg_1", "msg_2", "msg_3", "msg_4"}));

  Answer before = call(store, "GET", "/v1/responses/resp_a/input_items", "before=msg_1&limit=2");
  EXPECT_EQ(ids_of(before.body), (std::vector<std::string>{"msg_4", "msg_3"}));
  EXPECT_EQ(before.body["has_more"], true);  // msg_2 is still before msg_1
  Answer encoded = call(store, "GET", "/v1/responses/resp_a/input_items", "after=msg%5F3&include%5B%5D=x");
  EXPECT_EQ(ids_of(encoded.body), (std::vector<std::string>{"msg_2", "msg_1", "msg_0"}));

  for (const char* bad : {"limit=0", "limit=101", "limit=2x", "order=up", "after=msg_9"}) {
    Answer a = call(store, "GET", "/v1/responses/resp_a/input_items", bad);
    EXPECT_EQ(a.status, 400) << bad;
    EXPECT_EQ(a.param, std::string(bad).substr(0, std::string(bad).find('='))) << bad;
  }
}

}  // namespace
}  // namespace moeserve::server
