// The Responses API's store and its endpoints (GET/DELETE /v1/responses/{id}, input_items, cancel, the
// event stream of a background response), called as the service calls them: a request's method, path and
// query over a store. Background responses are driven here by publishing events as the encoder does.
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
    Reply r = stored_response_request(store, request(method, path, query), path.substr(prefix.size()));
    EXPECT_EQ(r.body, nullptr) << "a stream where an object was expected";
    return {r.response.status, json::parse(r.response.body), ""};
  } catch (const ApiError& e) {
    return {e.status, json(), e.param.value_or("")};
  }
}

// A background response as the service starts one: queued, its request's items named.
std::shared_ptr<BackgroundResponse> queued(const std::string& id) {
  json object = {{"id", id}, {"object", "response"}, {"status", "queued"}, {"output", json::array()}};
  return std::make_shared<BackgroundResponse>(object, response_with_items(id, 1).input_items);
}

json event(const std::string& type, json fields = json::object()) {
  json e = {{"type", type}};
  e.update(fields);
  return e;
}

// The events of an SSE body, in order.
std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at)) {
    const size_t end = sse.find('\n', at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

// What a stream body writes until it is done or has nothing more now.
std::string drain(AsyncBody& body) {
  std::string out;
  for (int i = 0; i < 100; ++i) {
    AsyncBody::Step s = body.poll(Clock::now());
    out += s.data;
    if (s.done || s.data.empty()) break;
  }
  return out;
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

TEST(ResponseStore, BackgroundResponseRunsThroughItsStatuses) {
  ResponseStore store;
  auto bg = queued("resp_bg");
  store.start_background("resp_bg", bg);
  EXPECT_EQ(store.running(), 1u);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg").body["status"], "queued");
  EXPECT_EQ(bg->next_sequence(), 2);  // response.created and response.queued
  bg->publish(event("response.in_progress", {{"sequence_number", 2}}));
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg").body["status"], "in_progress");
  json item = {{"id", "msg_1"}, {"type", "message"}, {"status", "completed"}};
  bg->publish(
      event("response.output_item.done", {{"sequence_number", 3}, {"output_index", 0}, {"item", item}}));
  json now = call(store, "GET", "/v1/responses/resp_bg").body;
  EXPECT_EQ(now["output"], json::array({item})) << "finished items show while it runs";
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg/input_items").body["data"].size(), 1u);

  json done = {{"id", "resp_bg"}, {"object", "response"}, {"status", "completed"}, {"output", {item}}};
  bg->publish(event("response.completed", {{"sequence_number", 4}, {"response", done}}));
  EXPECT_TRUE(bg->ended());
  EXPECT_EQ(store.running(), 0u);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg").body, done);
  bg->publish(event("response.in_progress"));  // after the end: ignored
  EXPECT_EQ(bg->next_sequence(), 5);

  // Cancelling a finished one is a 400 that says its status; an unknown id is a 404.
  Answer late = call(store, "POST", "/v1/responses/resp_bg/cancel");
  EXPECT_EQ(late.status, 400);
  EXPECT_EQ(late.param, "response_id");
  EXPECT_EQ(call(store, "POST", "/v1/responses/resp_unknown/cancel").status, 404);
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_unknown", "stream=true").status, 404);
}

TEST(ResponseStore, CancelStopsTheRunOnceAndASecondCancelAnswersTheSame) {
  ResponseStore store;
  auto bg = queued("resp_bg");
  store.start_background("resp_bg", bg);
  int stops = 0;
  bg->set_stop([&] { ++stops; });
  bg->publish(event("response.in_progress"));
  Answer first = call(store, "POST", "/v1/responses/resp_bg/cancel");
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body["status"], "cancelled");
  EXPECT_EQ(stops, 1);
  Answer second = call(store, "POST", "/v1/responses/resp_bg/cancel");
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(second.body, first.body);
  EXPECT_EQ(stops, 1) << "the run is stopped once";
  // The engine's events that were already on their way change nothing.
  bg->publish(event("response.completed", {{"response", {{"status", "completed"}}}}));
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg").body["status"], "cancelled");
  EXPECT_EQ(store.running(), 0u);

  // Cancelled before its runner was known: stopped as soon as it is.
  auto early = queued("resp_early");
  store.start_background("resp_early", early);
  EXPECT_TRUE(early->cancel());
  EXPECT_FALSE(early->cancel());
  early->set_stop([&] { ++stops; });
  EXPECT_EQ(stops, 2);

  // A failed run ends with response.failed and its message.
  auto failed = queued("resp_failed");
  store.start_background("resp_failed", failed);
  failed->fail("the request waited too long");
  json f = call(store, "GET", "/v1/responses/resp_failed").body;
  EXPECT_EQ(f["status"], "failed");
  EXPECT_EQ(f["error"]["message"], "the request waited too long");
  EXPECT_EQ(call(store, "POST", "/v1/responses/resp_failed/cancel").status, 400);

  // DELETE of a running one stops it too.
  auto deleted = queued("resp_deleted");
  store.start_background("resp_deleted", deleted);
  deleted->set_stop([&] { ++stops; });
  EXPECT_EQ(call(store, "DELETE", "/v1/responses/resp_deleted").status, 200);
  EXPECT_EQ(stops, 3);
  EXPECT_EQ(deleted->status(), "cancelled");
}

TEST(ResponseStore, RunningBackgroundResponsesAreNeverEvictedAndAreCapped) {
  ResponseStore store(/*max_entries=*/2, /*max_bytes=*/size_t{1} << 20, /*max_running=*/2);
  auto a = queued("resp_a"), b = queued("resp_b");
  store.start_background("resp_a", a);
  store.start_background("resp_b", b);
  try {
    store.start_background("resp_c", queued("resp_c"));
    ADD_FAILURE() << "a third running background response was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
    EXPECT_EQ(e.param, "background");
  }
  // Finished responses come and go around the running ones, which stay and do not count.
  for (const char* id : {"resp_x", "resp_y", "resp_z"}) store.put(id, response_with_items(id, 1));
  EXPECT_EQ(store.get("resp_x"), nullptr);
  EXPECT_NE(store.get("resp_y"), nullptr);
  EXPECT_NE(store.get("resp_z"), nullptr);
  EXPECT_NE(store.background("resp_a"), nullptr);
  EXPECT_NE(store.background("resp_b"), nullptr);
  EXPECT_EQ(store.size(), 4u);

  // Ended (the encoder stores its answer, then publishes the last event), it counts like any other.
  StoredResponse answer = response_with_items("resp_a", 1);
  store.put("resp_a", answer);
  a->publish(event("response.completed", {{"response", answer.response}}));
  EXPECT_EQ(store.background("resp_a"), a) << "the record stays beside the stored answer";
  store.start_background("resp_c", queued("resp_c"));  // room again
  EXPECT_EQ(store.running(), 2u);
  EXPECT_EQ(store.get("resp_y"), nullptr);
  store.put("resp_w", response_with_items("resp_w", 1));
  EXPECT_EQ(store.get("resp_z"), nullptr);
  EXPECT_NE(store.get("resp_a"), nullptr);
  store.put("resp_v", response_with_items("resp_v", 1));
  EXPECT_EQ(store.get("resp_a"), nullptr);  // ended, now the oldest: evicted, record and all
  EXPECT_EQ(store.background("resp_a"), nullptr);
  EXPECT_NE(store.background("resp_b"), nullptr);
}

TEST(ResponseStore, EventStreamResumesAfterASequenceNumberAndFollowsTheRun) {
  ResponseStore store;
  auto bg = queued("resp_bg");
  store.start_background("resp_bg", bg);
  bg->publish(event("response.in_progress", {{"response", {{"status", "in_progress"}}}}));
  for (int i = 0; i < 3; ++i)
    bg->publish(event("response.output_text.delta", {{"delta", std::to_string(i)}}));

  const std::string prefix = "/v1/responses/";
  Reply r = stored_response_request(store, request("GET", prefix + "resp_bg", "stream=true&starting_after=3"),
                                    "resp_bg");
  ASSERT_NE(r.body, nullptr);
  int wakes = 0;
  r.body->start([&] { ++wakes; });
  AsyncBody::Step first = r.body->poll(Clock::now());
  ASSERT_TRUE(first.head);
  EXPECT_EQ(first.head->content_type, "text/event-stream");
  std::vector<json> got = events_of(first.data);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]["sequence_number"], 4);
  EXPECT_EQ(got[0]["delta"], "1");
  EXPECT_FALSE(first.done);

  // Live: a new event wakes the stream, and the end ends it.
  const int before = wakes;
  bg->publish(event("response.output_text.delta", {{"delta", "3"}}));
  EXPECT_GT(wakes, before);
  bg->publish(
      event("response.completed", {{"response", {{"status", "completed"}, {"output", json::array()}}}}));
  std::string rest = drain(*r.body);
  got = events_of(rest);
  ASSERT_EQ(got.size(), 2u) << rest;
  EXPECT_EQ(got[0]["sequence_number"], 6);
  EXPECT_EQ(got[1]["type"], "response.completed");
  EXPECT_TRUE(r.body->poll(Clock::now()).done);

  // From the start, the whole record: created and queued first, numbered from 0 without gaps.
  Reply all = stored_response_request(store, request("GET", prefix + "resp_bg", "stream=true"), "resp_bg");
  all.body->start([] {});
  got = events_of(drain(*all.body));
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(got[0]["type"], "response.created");
  EXPECT_EQ(got[1]["type"], "response.queued");
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i]["sequence_number"], i);

  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg", "stream=true&starting_after=-1").param,
            "starting_after");
  EXPECT_EQ(call(store, "GET", "/v1/responses/resp_bg", "stream=true&starting_after=x").param,
            "starting_after");
}

}  // namespace
}  // namespace moeserve::server
