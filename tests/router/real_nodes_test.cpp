// The router in front of real `moeserve serve --model demo` nodes (child processes on loopback), as in the
// deployment: least_conn spreads streams over the nodes by their in-flight counts; a node killed mid-run
// loses only the streams it was serving (each ends with a clean error event) while every new request succeeds
// on the others; the node rejoins after fail_timeout; and on a multi-turn workload cache_aware makes the
// nodes' own prefix caches hit (usage.prompt_tokens_details.cached_tokens) far more than round_robin does.
// The router runs in this process with a clock the test moves, so nothing here waits on a timer.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "demo_node.h"
#include "http_peer.h"
#include "router/router.h"

namespace moeserve::router {
namespace {

using namespace testing;
using namespace std::chrono_literals;
using json = nlohmann::json;

constexpr int kSlow = 600'000;  // ms: only a guard against a hang (the demo model on a busy 2-core machine)

using Node = testing::DemoNode;

struct Cluster {
  std::vector<std::unique_ptr<Node>> nodes;
  explicit Cluster(int n) {
    for (int i = 0; i < n; ++i) nodes.push_back(std::make_unique<Node>(std::string(1, char('a' + i))));
  }
  ::testing::AssertionResult ready() {
    for (auto& node : nodes)
      if (!node->ready())
        return ::testing::AssertionFailure() << node->url() << " did not start; see " << node->log();
    return ::testing::AssertionSuccess();
  }
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (const auto& node : nodes) out.push_back(node->url());
    return out;
  }
};

struct TestClock {
  std::atomic<int64_t> offset_ms{0};
  std::function<TimePoint()> fn() {
    return [this] { return Clock::now() + std::chrono::milliseconds(offset_ms.load()); };
  }
  void advance(Duration d) { offset_ms += d.count(); }
};

RouterConfig config_for(const std::vector<std::string>& urls, Policy policy) {
  RouterConfig config;
  config.host = "127.0.0.1";
  config.port = 0;
  config.workers = 2;
  config.policy = policy;
  config.health_interval =
      Duration(0);  // passive detection only: the test's clock decides when a node rejoins
  for (const auto& url : urls) {
    BackendSpec spec;
    spec.url = url;
    config.backends.push_back(spec);
  }
  return config;
}

// A generation that keeps its node busy until the client goes away: it ignores the end-of-sequence token and
// may run for 30 000 tokens (the demo model's context is 32 768).
std::string endless_stream(int i) {
  return json{{"model", "demo"},
              {"stream", true},
              {"ignore_eos", true},
              {"max_tokens", 30000},
              {"messages", {{{"role", "user"}, {"content", "stream " + std::to_string(i)}}}}}
      .dump();
}

std::string short_chat(const std::string& content, int max_tokens = 4) {
  return json{
      {"model", "demo"}, {"max_tokens", max_tokens}, {"messages", {{{"role", "user"}, {"content", content}}}}}
      .dump();
}

// Opens a stream and reads its first two events (the role, then a generated token): from then on its node is
// generating it and the router counts it in flight there.
std::unique_ptr<HttpClient> open_stream(uint16_t port, int i) {
  auto client = std::make_unique<HttpClient>(port);
  client->send("POST", "/v1/chat/completions", endless_stream(i));
  HttpResponse response;
  EXPECT_TRUE(client->read_head(response, kSlow));
  EXPECT_EQ(response.status, 200) << client->read_chunk(response).value_or("");
  EXPECT_TRUE(client->read_chunk(response, kSlow));
  EXPECT_TRUE(client->read_chunk(response, kSlow));
  return client;
}

json backends_of(Router& router) {
  return json::parse(http_request(router.port(), "GET", "/backends").body);
}

HttpResponse post_chat(uint16_t port, const std::string& content) {
  return http_request(port, "POST", "/v1/chat/completions", short_chat(content), {}, kSlow);
}

// One cluster for the whole story, as nodes take seconds to start: spread, death, recovery.
TEST(RouterRealNodes, LeastConnSpreadsAKilledNodeLosesOnlyItsStreamsAndRejoinsAfterFailTimeout) {
  Cluster cluster(3);
  ASSERT_TRUE(cluster.ready());
  TestClock clock;
  RouterConfig config = config_for(cluster.urls(), Policy::least_conn);
  config.max_fails = 3;
  config.fail_timeout = 30s;
  Router router(config, nullptr, clock.fn());
  router.start();

  // Six streams that run until their client leaves, opened one after the other. Each lands on a node with
  // the fewest in flight: two per node, which each node's own running gauge confirms.
  std::vector<std::unique_ptr<HttpClient>> streams;
  std::vector<int> home;  // node of each stream: the one whose running gauge went up
  std::vector<double> running(3, 0);
  for (int i = 0; i < 6; ++i) {
    streams.push_back(open_stream(router.port(), i));
    int moved = -1;
    for (int b = 0; b < 3; ++b) {
      double now = cluster.nodes[b]->metric("moeserve:num_requests_running");
      if (now == running[b] + 1) moved = b;
      running[b] = now;
    }
    ASSERT_GE(moved, 0) << "no node started stream " << i;
    home.push_back(moved);
  }
  EXPECT_EQ(running, std::vector<double>(3, 2)) << "least_conn must put two streams on each node";
  json backends = backends_of(router);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(backends[b]["in_flight"], 2) << backends.dump(2);

  // Node b dies. Its two streams end with an OpenAI-style error event, then [DONE], and a closed connection;
  // the four others keep streaming.
  Node& victim = *cluster.nodes[1];
  victim.kill();
  for (size_t i = 0; i < streams.size(); ++i) {
    HttpResponse response;
    response.status = 200;
    if (home[i] == 1) {
      while (streams[i]->read_chunk(response, kSlow)) {
      }
      auto error_at = response.body.find("data: {\"error\"");
      EXPECT_NE(error_at, std::string::npos) << response.body;
      EXPECT_GT(response.body.find("data: [DONE]"), error_at) << response.body;
      HttpResponse next;
      EXPECT_FALSE(streams[i]->read_head(next, 1000)) << "the connection must close after a broken stream";
    } else {
      for (int events = 0; events < 5; ++events) EXPECT_TRUE(streams[i]->read_chunk(response, kSlow)) << i;
      EXPECT_EQ(response.body.find("\"error\""), std::string::npos) << response.body;
    }
  }
  streams.clear();  // the nodes abort the generations of clients that left

  // Every new request succeeds on the two others: a node that died on a request is out of rotation at once
  // (for fail_timeout, as health checks are off here).
  for (int i = 0; i < 12; ++i) {
    HttpResponse response = post_chat(router.port(), "after " + std::to_string(i));
    EXPECT_EQ(response.status, 200) << response.body;
  }
  backends = backends_of(router);
  EXPECT_EQ(backends[1]["state"], "ejected") << backends.dump(2);

  // Back on the same port, it gets traffic again once fail_timeout has passed (the router's clock).
  victim.start();
  ASSERT_TRUE(victim.ready()) << victim.log();
  clock.advance(31s);
  for (int i = 0; i < 6; ++i) {
    HttpResponse response = post_chat(router.port(), "back " + std::to_string(i));
    EXPECT_EQ(response.status, 200) << response.body;
  }
  EXPECT_GE(victim.metric("moeserve:request_success_total"), 1) << "the node did not rejoin";
  backends = backends_of(router);
  EXPECT_NE(backends[1]["state"], "ejected") << backends.dump(2);
}

// Conversations of several turns, each turn sending the whole history back, interleaved turn by turn. Returns
// the share of prompt tokens the nodes found in their prefix caches.
double cached_share(uint16_t port, const std::string& topic) {
  constexpr int kConversations = 3, kTurns = 4;  // 3 conversations over 2 nodes: round robin moves each one
  std::vector<json> histories(kConversations, json::array());
  int64_t prompt = 0, cached = 0;
  for (int turn = 0; turn < kTurns; ++turn) {
    for (int c = 0; c < kConversations; ++c) {
      histories[c].push_back({{"role", "user"},
                              {"content", topic + " conversation " + std::to_string(c) + ", question " +
                                              std::to_string(turn) + ": please explain it at some length."}});
      json body = {{"model", "demo"}, {"max_tokens", 24}, {"temperature", 0}, {"messages", histories[c]}};
      HttpResponse response = http_request(port, "POST", "/v1/chat/completions", body.dump(), {}, kSlow);
      EXPECT_EQ(response.status, 200) << response.body;
      json j = json::parse(response.body, nullptr, false);
      if (!j.is_object()) continue;
      prompt += j["usage"]["prompt_tokens"].get<int64_t>();
      cached += j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
      histories[c].push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
    }
  }
  return prompt ? double(cached) / double(prompt) : 0;
}

TEST(RouterRealNodes, CacheAwareHitsTheNodesPrefixCachesMoreThanRoundRobin) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ready());
  double round_robin = 0, cache_aware = 0;
  {
    Router router(config_for(cluster.urls(), Policy::round_robin));
    router.start();
    round_robin = cached_share(router.port(), "Round robin");
  }
  {
    Router router(config_for(cluster.urls(), Policy::cache_aware));
    router.start();
    cache_aware =
        cached_share(router.port(), "Cache aware");  // other text: nothing cached from the first run
  }
  RecordProperty("round_robin_cached_share", std::to_string(round_robin));
  RecordProperty("cache_aware_cached_share", std::to_string(cache_aware));
  std::printf("cached share of prompt tokens: round_robin %.3f, cache_aware %.3f\n", round_robin,
              cache_aware);
  EXPECT_GT(cache_aware, round_robin + 0.2);
}

// The Responses API behind the router: each node keeps the responses it made, and the router learns from
// the answers which node made which, so a conversation continued by previous_response_id reaches its node
// under round_robin (which would send every second turn to the other node, a 404 there), streamed or not.
// When that node is gone, the turn goes to another node, which answers a clean 404.
TEST(RouterRealNodes, PreviousResponseIdReachesTheNodeThatHoldsIt) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ready());
  Router router(config_for(cluster.urls(), Policy::round_robin));
  router.start();
  auto turn = [&](uint16_t port, const std::string& previous, bool stream) {
    json body = {{"model", "demo"}, {"input", "turn after " + previous}, {"max_output_tokens", 3}};
    if (!previous.empty()) body["previous_response_id"] = previous;
    if (stream) body["stream"] = true;
    return http_request(port, "POST", "/v1/responses", body.dump(), {}, kSlow);
  };
  auto id_of = [](const HttpResponse& r, bool stream) -> std::string {
    if (!stream) return json::parse(r.body).value("id", "");
    const size_t data = r.body.find("data: ");  // the first event: response.created
    if (data == std::string::npos) return "";
    return json::parse(r.body.substr(data + 6, r.body.find('\n', data) - data - 6))["response"].value("id",
                                                                                                      "");
  };
  std::string previous;
  for (int i = 0; i < 6; ++i) {
    const bool stream = i % 3 == 1;
    HttpResponse r = turn(router.port(), previous, stream);
    ASSERT_EQ(r.status, 200) << "turn " << i << ": " << r.body;
    previous = id_of(r, stream);
    ASSERT_TRUE(previous.starts_with("resp")) << r.body;
  }
  // The node that holds the conversation, asked directly; the other one does not know it.
  const int holder = turn(cluster.nodes[0]->port(), previous, false).status == 200 ? 0 : 1;
  HttpResponse direct = turn(cluster.nodes[1 - holder]->port(), previous, false);
  EXPECT_EQ(direct.status, 404) << direct.body;

  cluster.nodes[size_t(holder)]->kill();
  HttpResponse gone = turn(router.port(), previous, false);
  EXPECT_EQ(gone.status, 404) << gone.body;
  EXPECT_NE(gone.body.find("previous_response_id"), std::string::npos) << gone.body;
}

// The stored responses behind the router: a retrieve, an input_items list, a cancel and a delete name the
// response in their path, and reach the node that holds it under round_robin (the other node has never seen
// it: a 404 there).
TEST(RouterRealNodes, StoredResponseRequestsReachTheNodeThatHoldsIt) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ready());
  Router router(config_for(cluster.urls(), Policy::round_robin));
  router.start();
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    json body = {{"model", "demo"}, {"input", "stored " + std::to_string(i)}, {"max_output_tokens", 2}};
    HttpResponse r = http_request(router.port(), "POST", "/v1/responses", body.dump(), {}, kSlow);
    ASSERT_EQ(r.status, 200) << r.body;
    ids.push_back(json::parse(r.body)["id"]);
  }
  for (const std::string& id : ids) {
    for (int repeat = 0; repeat < 2; ++repeat) {  // round_robin alternates: each request would change node
      HttpResponse got = http_request(router.port(), "GET", "/v1/responses/" + id, "", {}, kSlow);
      EXPECT_EQ(got.status, 200) << got.body;
      if (got.status == 200) {
        EXPECT_EQ(json::parse(got.body)["id"], id);
      }
      HttpResponse items =
          http_request(router.port(), "GET", "/v1/responses/" + id + "/input_items?limit=5", "", {}, kSlow);
      EXPECT_EQ(items.status, 200) << items.body;
    }
    EXPECT_EQ(http_request(router.port(), "POST", "/v1/responses/" + id + "/cancel", "", {}, kSlow).status,
              400);
    EXPECT_EQ(http_request(router.port(), "DELETE", "/v1/responses/" + id, "", {}, kSlow).status, 200);
    EXPECT_EQ(http_request(router.port(), "GET", "/v1/responses/" + id, "", {}, kSlow).status, 404);
  }

  // Background responses: the router learns their id from the queued object, so polling, the replayed event
  // stream and the cancel reach the node that runs them.
  std::vector<std::string> background;
  for (int i = 0; i < 2; ++i) {
    json body = {{"model", "demo"},
                 {"input", "later " + std::to_string(i)},
                 {"max_output_tokens", 2},
                 {"background", true}};
    HttpResponse r = http_request(router.port(), "POST", "/v1/responses", body.dump(), {}, kSlow);
    ASSERT_EQ(r.status, 200) << r.body;
    background.push_back(json::parse(r.body)["id"]);
  }
  for (const std::string& id : background) {
    json now;
    for (int i = 0; i < 5000; ++i) {  // asked again until it has ended (each answer takes a round trip)
      HttpResponse got = http_request(router.port(), "GET", "/v1/responses/" + id, "", {}, kSlow);
      ASSERT_EQ(got.status, 200) << got.body;
      now = json::parse(got.body);
      if (now["status"] != "queued" && now["status"] != "in_progress") break;
    }
    EXPECT_EQ(now["status"], "incomplete") << now.dump();  // cut by max_output_tokens
    HttpResponse events =
        http_request(router.port(), "GET", "/v1/responses/" + id + "?stream=true", "", {}, kSlow);
    EXPECT_EQ(events.status, 200) << events.body;
    EXPECT_NE(events.body.find("event: response.incomplete"), std::string::npos) << events.body;
    EXPECT_EQ(http_request(router.port(), "POST", "/v1/responses/" + id + "/cancel", "", {}, kSlow).status,
              400);  // it has ended
  }
}

}  // namespace
}  // namespace moeserve::router
