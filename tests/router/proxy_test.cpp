// The router on loopback, in this process, in front of scripted backends (tests/router/http_peer.h):
// streaming without buffering, least_conn spreading, ejection and return, retries before the first byte and
// never after, 429 Retry-After, cache_aware stickiness, /v1/models merging, admin calls, limits, and /metrics
// under promtool.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "router_fixture.h"

namespace moeserve::router {
namespace {

using namespace testing;
using namespace std::chrono_literals;

TEST(RouterProxy, StreamsEachChunkBeforeTheBackendFinishes) {
  Gate client_has_first;
  FakeBackend backend([&](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("first"));
    client_has_first.wait();  // the rest of the response waits until the client got the first chunk
    c.chunk(sse_event("second"));
    c.chunk("data: [DONE]\n\n");
    c.end_stream();
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}, true));
  HttpResponse response;
  ASSERT_TRUE(client.read_head(response));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("content-type"), "text/event-stream");
  auto first = client.read_chunk(response);
  ASSERT_TRUE(first.has_value())
      << "the first chunk did not reach the client while the backend held the rest";
  EXPECT_NE(first->find("first"), std::string::npos);
  EXPECT_FALSE(client_has_first.is_open());
  client_has_first.open();
  while (client.read_chunk(response)) {
  }
  EXPECT_TRUE(response.complete);
  EXPECT_NE(response.body.find("second"), std::string::npos);
  EXPECT_NE(response.body.find("[DONE]"), std::string::npos);
}

TEST(RouterProxy, SendsTheHeadBeforeTheFirstEventExists) {
  Gate client_has_head;
  FakeBackend backend([&](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    // A long prefill: the first event comes only after the client saw the head.
    if (!client_has_head.wait(60'000)) return;
    c.chunk(sse_event("late"));
    c.end_stream();
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}, true));
  HttpResponse response;
  ASSERT_TRUE(client.read_head(response, 20'000))
      << "the router held the response head until the body started";
  EXPECT_EQ(response.status, 200);
  EXPECT_FALSE(client_has_head.is_open());
  client_has_head.open();
  while (client.read_chunk(response)) {
  }
  EXPECT_TRUE(response.complete);
  EXPECT_NE(response.body.find("late"), std::string::npos);
}

// Everything in one send with the head: the router takes the events that came with the head, a burst larger
// than one read, and a chunk larger than its relay buffer, and the client gets them all in order.
TEST(RouterProxy, RelaysBurstsAndChunksLargerThanTheRelayBufferIntact) {
  std::string expected;
  std::string burst;
  auto add_chunk = [&](const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    burst += size + data + "\r\n";
    expected += data;
  };
  for (int i = 0; i < 2000; ++i) add_chunk(sse_event("t" + std::to_string(i)));
  add_chunk("data: " + std::string(100'000, 'x') + "\n\n");
  for (int i = 0; i < 50; ++i) add_chunk(sse_event("after" + std::to_string(i)));
  burst += "0\r\n\r\n";
  FakeBackend backend([&](const HttpRequest&, BackendConnection& c) {
    c.send_raw("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
               burst);
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  for (int round = 0; round < 2; ++round) {  // the second one on the kept-alive connections
    client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}, true));
    HttpResponse response = client.read_response();
    EXPECT_EQ(response.status, 200);
    EXPECT_TRUE(response.complete);
    EXPECT_TRUE(response.body == expected)
        << "got " << response.body.size() << " of " << expected.size() << " bytes, or out of order";
  }
  EXPECT_EQ(backend.connections_accepted(), 1u);
}

TEST(RouterProxy, ReusesUpstreamConnectionsAndRelaysEmptyBodies) {
  FakeBackend backend([](const HttpRequest& r, BackendConnection& c) {
    c.respond(200, r.target == "/empty" ? "" : R"({"ok":true})");
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  for (const char* target : {"/empty", "/v1/models", "/empty", "/v1/completions"}) {
    client.send("POST", target, "{}");
    HttpResponse response = client.read_response();
    EXPECT_EQ(response.status, 200) << target;
    EXPECT_TRUE(response.complete) << target;
  }
  EXPECT_EQ(backend.connections_accepted(), 1u) << "keep-alive upstream connections must be reused";
}

// The keep-alive race: the backend closes each connection right after its response, without a
// `Connection: close`. A pooled connection is checked before it is reused, so a POST sent after the close
// arrived goes on a fresh connection; a GET that meets the close after it went out goes again on a fresh one
// (it is idempotent). Neither is a failure of the backend.
TEST(RouterProxy, ARequestMeetingAClosedPooledConnectionGoesAgainOnAFreshOne) {
  FakeBackend backend([](const HttpRequest&, BackendConnection& c) {
    c.respond(200, R"({"ok":true})");
    c.hang_up();
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  for (size_t i = 0; i < 6; ++i) {
    client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}));
    HttpResponse response = client.read_response();
    EXPECT_EQ(response.status, 200) << "request " << i;
    EXPECT_EQ(response.body, R"({"ok":true})") << "request " << i;
    ASSERT_TRUE(backend.wait_closed(i + 1));  // the close has reached the router's pooled connection
  }
  for (int i = 0; i < 6; ++i) {  // sent at once: some meet a connection the backend is closing
    client.send("GET", "/v1/files");
    HttpResponse response = client.read_response();
    EXPECT_EQ(response.status, 200) << "request " << i;
  }
  EXPECT_EQ(backend.request_count(), 12u) << "each request reached the backend exactly once";
  auto described = router.balancer().describe();
  EXPECT_EQ(described[0]["failures"], 0) << described.dump();
  EXPECT_EQ(described[0]["fails"], 0) << described.dump();
}

TEST(RouterProxy, LeastConnSpreadsConcurrentStreamsEvenly) {
  Gate release;
  auto hold = [&](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("token"));
    release.wait();
    c.end_stream();
  };
  FakeBackend a(hold), b(hold), c(hold);
  Router router(config_for({a.url(), b.url(), c.url()}));
  router.start();
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (size_t i = 0; i < 9; ++i) {
    clients.push_back(std::make_unique<HttpClient>(router.port()));
    clients.back()->send("POST", "/v1/chat/completions",
                         chat_body({{"user", "q" + std::to_string(i)}}, true));
    HttpResponse head;
    ASSERT_TRUE(clients.back()->read_head(head));  // the stream is open: its backend counts it in flight
  }
  EXPECT_EQ(a.request_count(), 3u);
  EXPECT_EQ(b.request_count(), 3u);
  EXPECT_EQ(c.request_count(), 3u);
  release.open();
  for (auto& client : clients) {
    HttpResponse response;
    while (client->read_chunk(response)) {
    }
  }
}

// What is safe to send elsewhere: a request no backend took (connection refused, 503), and an idempotent
// one whatever happened to it. (A POST a backend dropped is not: tests/router/hostile_test.cpp.)
TEST(RouterProxy, RetriesOnAnotherBackendWhatIsSafeToSendAgain) {
  FakeBackend unavailable([](const HttpRequest&, BackendConnection& c) {
    c.respond(503, R"({"error":{"message":"overloaded"}})");
  });
  FakeBackend healthy(answer_with("healthy"));
  uint16_t refused_port = free_port();  // nothing listens there
  Router router(
      config_for({unavailable.url(), "http://127.0.0.1:" + std::to_string(refused_port), healthy.url()}));
  router.start();
  for (int i = 0; i < 4; ++i) {
    auto response = post_chat(router.port());
    EXPECT_EQ(response.status, 200) << response.body;
    EXPECT_EQ(backend_of(response), "healthy");
  }
  EXPECT_GE(unavailable.request_count(), 1u);
  EXPECT_EQ(healthy.request_count(), 4u);
  std::string metrics = http_request(router.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("moeserve_router_retries_total{reason=\"status 503\"}"), std::string::npos);

  FakeBackend resetting([](const HttpRequest&, BackendConnection& c) { c.reset(); });
  FakeBackend other(answer_with("other"));
  Router get_router(config_for({resetting.url(), other.url()}));
  get_router.start();
  auto response = http_request(get_router.port(), "GET", "/v1/files");
  EXPECT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(backend_of(response), "other");
  EXPECT_EQ(resetting.request_count(), 1u);
}

TEST(RouterProxy, NeverRetriesAfterStreamingStartedAndEndsWithAnErrorEvent) {
  FakeBackend dying([](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("partial"));
    c.reset();  // the backend crashes mid-stream
  });
  FakeBackend healthy(answer_with("healthy"));
  Router router(config_for({dying.url(), healthy.url()}));
  router.start();
  HttpClient client(router.port());
  client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}, true));
  HttpResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_NE(response.body.find("partial"), std::string::npos);
  auto error_at = response.body.find("data: {\"error\"");
  ASSERT_NE(error_at, std::string::npos) << response.body;
  EXPECT_GT(error_at, response.body.find("partial"));
  EXPECT_GT(response.body.find("data: [DONE]"), error_at) << response.body;
  EXPECT_EQ(healthy.request_count(), 0u) << "a request whose response had started must not be sent again";
  EXPECT_TRUE(client.wait_closed()) << "the connection must close after a broken stream";
  auto described = router.balancer().describe();
  EXPECT_EQ(described[0]["state"], "ejected") << "a backend that died mid-stream is out at once\n"
                                              << described.dump();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(backend_of(post_chat(router.port())), "healthy");
  EXPECT_EQ(dying.request_count(), 1u);
}

// The router's timeouts (kept lazily by a watchdog, not a timer per read): a backend silent before its
// answer is a failure, retried elsewhere for a GET and answered with 504 for a POST (it may be generating);
// one silent mid-stream ends the stream with an error event, and a client that sends nothing is
// disconnected.
TEST(RouterProxy, ReadAndClientHeaderTimeoutsEndSilentPeers) {
  Gate done;
  FakeBackend silent([&](const HttpRequest& r, BackendConnection& c) {
    if (r.body.find("\"stream\":true") != std::string::npos) {
      c.start_stream();
      c.chunk(sse_event("partial"));
    }
    done.wait(30'000);  // then nothing, far longer than --read-timeout
  });
  FakeBackend healthy(answer_with("healthy"));
  auto config = [](const std::vector<std::string>& urls) {
    RouterConfig c = config_for(urls);
    c.read_timeout = 300ms;
    c.client_header_timeout = 300ms;
    return c;
  };
  {
    Router router(config({silent.url(), healthy.url()}));
    router.start();
    // least_conn's ties alternate (smooth round robin): the first GET and the POST meet the silent one.
    HttpResponse get = http_request(router.port(), "GET", "/v1/files");
    EXPECT_EQ(get.status, 200);
    EXPECT_EQ(backend_of(get), "healthy") << "a GET to a backend silent before answering goes elsewhere";
    EXPECT_EQ(backend_of(http_request(router.port(), "GET", "/v1/files")), "healthy");
    HttpResponse post = post_chat(router.port());
    EXPECT_EQ(post.status, 504) << post.body;
    EXPECT_NE(post.body.find("--read-timeout"), std::string::npos) << post.body;
    EXPECT_EQ(healthy.request_count(), 2u) << "a POST without an answer must not be sent again";
    auto described = router.balancer().describe();
    EXPECT_EQ(described[0]["failures"], 2) << described.dump();
  }
  Router router(config({silent.url()}));
  router.start();
  HttpClient streaming(router.port());
  streaming.send("POST", "/v1/chat/completions", chat_body({{"user", "stream"}}, true));
  HttpResponse stream = streaming.read_response(10'000);
  EXPECT_EQ(stream.status, 200);
  EXPECT_NE(stream.body.find("partial"), std::string::npos);
  EXPECT_NE(stream.body.find("read timeout"), std::string::npos) << stream.body;

  HttpClient idle(router.port());
  HttpResponse nothing;
  EXPECT_FALSE(idle.read_head(nothing, 10'000));
  char byte;
  EXPECT_EQ(::recv(idle.fd(), &byte, 1, MSG_DONTWAIT), 0) << "an idle client must be disconnected";
  done.open();
}

TEST(RouterProxy, EjectsAfterMaxFailsAndTakesTheBackendBackAfterFailTimeout) {
  std::atomic<bool> broken{true};
  FakeBackend flaky([&](const HttpRequest&, BackendConnection& c) {
    if (broken)
      c.respond(503, R"({"error":{"message":"overloaded"}})");
    else
      c.respond(200, R"({"backend":"flaky"})");
  });
  FakeBackend steady(answer_with("steady"));
  TestClock clock;
  RouterConfig config = config_for({flaky.url(), steady.url()});
  config.max_fails = 3;
  config.fail_timeout = 30s;
  Router router(config, nullptr, clock.fn());
  router.start();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(post_chat(router.port()).status, 200);
  EXPECT_EQ(flaky.request_count(), 3u) << "after max_fails=3 failures the backend is out for fail_timeout";
  auto backends = json::parse(http_request(router.port(), "GET", "/backends").body);
  EXPECT_EQ(backends[0]["state"], "ejected");
  EXPECT_EQ(backends[0]["fails"], 3);

  broken = false;
  clock.advance(31s);
  std::map<std::string, int> served;
  for (int i = 0; i < 6; ++i) ++served[backend_of(post_chat(router.port()))];
  EXPECT_GE(served["flaky"], 2) << "the backend must rejoin on its own after fail_timeout";
  backends = json::parse(http_request(router.port(), "GET", "/backends").body);
  EXPECT_EQ(backends[0]["state"], "healthy");
  EXPECT_EQ(backends[0]["fails"], 0);
  std::string metrics = http_request(router.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("moeserve_router_backend_ejections_total{backend=\"" + flaky.url() +
                         "\",mechanism=\"max_fails\"} 1"),
            std::string::npos);
}

TEST(RouterProxy, HonoursRetryAfterOn429) {
  std::atomic<bool> saturated{true};
  FakeBackend busy([&](const HttpRequest&, BackendConnection& c) {
    if (saturated)
      c.respond(429, R"({"error":{"message":"queue full"}})", "application/json", {{"Retry-After", "20"}});
    else
      c.respond(200, R"({"backend":"busy"})");
  });
  FakeBackend other(answer_with("other"));
  TestClock clock;
  Router router(config_for({busy.url(), other.url()}), nullptr, clock.fn());
  router.start();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(backend_of(post_chat(router.port())), "other");
  EXPECT_EQ(busy.request_count(), 1u) << "Retry-After must keep requests away from the busy backend";
  auto backends = json::parse(http_request(router.port(), "GET", "/backends").body);
  EXPECT_EQ(backends[0]["state"], "busy");
  EXPECT_EQ(backends[0]["fails"], 0) << "a 429 is not a failure";
  saturated = false;
  clock.advance(20s);
  std::set<std::string> served;
  for (int i = 0; i < 4; ++i) served.insert(backend_of(post_chat(router.port())));
  EXPECT_TRUE(served.count("busy"));
}

TEST(RouterProxy, PassesTheLastAnswerThroughWhenNoBackendIsLeft) {
  FakeBackend busy([](const HttpRequest&, BackendConnection& c) {
    c.respond(429, R"({"error":{"message":"queue full"}})", "application/json", {{"Retry-After", "1"}});
  });
  Router router(config_for({busy.url()}));
  router.start();
  auto response = post_chat(router.port());
  EXPECT_EQ(response.status, 429);
  EXPECT_EQ(response.header("retry-after"), "1");
  EXPECT_NE(response.body.find("queue full"), std::string::npos);
}

TEST(RouterProxy, CacheAwareKeepsEachConversationOnOneBackend) {
  FakeBackend a(answer_with("a")), b(answer_with("b")), c(answer_with("c"));
  Router router(config_for({a.url(), b.url(), c.url()}, Policy::cache_aware));
  router.start();
  std::map<int, std::set<std::string>> homes;
  std::set<std::string> used;
  for (int turn = 0; turn < 4; ++turn) {
    for (int conversation = 0; conversation < 6; ++conversation) {
      // Conversations share little ("user\n"), each turn extends the previous one.
      std::vector<std::pair<std::string, std::string>> messages = {
          {"user", std::to_string(conversation * 7919) + ": tell me about topic " +
                       std::to_string(conversation * 31) + " in some detail please, with examples."}};
      for (int t = 1; t <= turn; ++t) {
        messages.push_back(
            {"assistant", "Answer number " + std::to_string(t) + " with a few sentences of text."});
        messages.push_back({"user", "Follow-up question " + std::to_string(t) + "?"});
      }
      auto response = post_chat(router.port(), chat_body(messages));
      ASSERT_EQ(response.status, 200);
      homes[conversation].insert(backend_of(response));
      used.insert(backend_of(response));
    }
  }
  for (const auto& [conversation, backends] : homes)
    EXPECT_EQ(backends.size(), 1u) << "conversation " << conversation << " moved between backends";
  EXPECT_EQ(used.size(), 3u) << "new conversations should spread over the backends\n"
                             << http_request(router.port(), "GET", "/metrics").body;
  std::string metrics = http_request(router.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find(
                "moeserve_router_routing_decisions_total{policy=\"cache_aware\",decision=\"cache_hit\"} 18"),
            std::string::npos)
      << metrics;
}

TEST(RouterProxy, MergesModelsAndRoutesByModel) {
  auto serving = [](std::string model) {
    return [model](const HttpRequest& r, BackendConnection& c) {
      if (r.target == "/v1/models")
        c.respond(200, json{{"object", "list"}, {"data", {{{"id", model}, {"object", "model"}}}}}.dump());
      else if (r.target == "/health")
        c.respond(200, "{}");
      else if (r.target == "/metrics")
        c.respond(200, "moeserve:num_requests_running 0\n", "text/plain");
      else
        c.respond(200, json{{"backend", model}}.dump());
    };
  };
  FakeBackend big(serving("big")), small(serving("small"));
  RouterConfig config = config_for({big.url(), small.url()});
  config.health_interval = 100ms;
  Router router(config);
  router.start();
  json models;
  for (int i = 0; i < 100; ++i) {
    models = json::parse(http_request(router.port(), "GET", "/v1/models").body, nullptr, false);
    if (models.is_object() && models["data"].size() == 2) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(models["data"].size(), 2u) << models.dump();
  std::set<std::string> ids = {models["data"][0]["id"], models["data"][1]["id"]};
  EXPECT_EQ(ids, (std::set<std::string>{"big", "small"}));
  json body = json::parse(chat_body({{"user", "hi"}}));
  body["model"] = "small";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(backend_of(post_chat(router.port(), body.dump())), "small");
}

TEST(RouterProxy, AdminAddsDrainsAndRemovesBackendsWithTheKey) {
  FakeBackend a(answer_with("a")), b(answer_with("b"));
  RouterConfig config = config_for({a.url()});
  config.admin_key = "secret";
  Router router(config);
  router.start();
  std::string add = json{{"url", b.url()}}.dump();
  EXPECT_EQ(http_request(router.port(), "POST", "/backends/add", add).status, 401);
  std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer secret"}};
  EXPECT_EQ(http_request(router.port(), "POST", "/backends/add", add, auth).status, 200);
  EXPECT_EQ(json::parse(http_request(router.port(), "GET", "/backends").body).size(), 2u);
  EXPECT_EQ(
      http_request(router.port(), "POST", "/backends/drain", json{{"url", a.url()}}.dump(), auth).status,
      200);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(backend_of(post_chat(router.port())), "b");
  EXPECT_EQ(
      http_request(router.port(), "POST", "/backends/remove", json{{"url", a.url()}}.dump(), auth).status,
      200);
  auto listed = json::parse(http_request(router.port(), "GET", "/backends").body);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["url"], b.url());
}

TEST(RouterProxy, RefusesOversizedBodiesAndMissingApiKeys) {
  FakeBackend a(answer_with("a"));
  RouterConfig config = config_for({a.url()});
  config.max_body_bytes = 1000;
  config.api_key = "k";
  Router router(config);
  router.start();
  std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer k"}};
  EXPECT_EQ(http_request(router.port(), "POST", "/v1/chat/completions", chat_body({{"user", "hi"}})).status,
            401);
  EXPECT_EQ(
      http_request(router.port(), "POST", "/v1/chat/completions", chat_body({{"user", "hi"}}), auth).status,
      200);
  auto big = http_request(router.port(), "POST", "/v1/chat/completions",
                          chat_body({{"user", std::string(5000, 'x')}}), auth);
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(a.request_count(), 1u);
}

TEST(RouterProxy, AnswersWithAClearErrorWhenEveryBackendIsDown) {
  Router router(config_for({"http://127.0.0.1:" + std::to_string(free_port())}));
  router.start();
  auto response = post_chat(router.port());
  EXPECT_EQ(response.status, 502);
  auto body = json::parse(response.body);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("connect"), std::string::npos) << response.body;
}

TEST(RouterProxy, MetricsPassPromtool) {
  FakeBackend a(answer_with("a"));
  FakeBackend failing([](const HttpRequest&, BackendConnection& c) { c.respond(503, "{}"); });
  Router router(config_for({failing.url(), a.url()}, Policy::cache_aware));
  router.start();
  for (int i = 0; i < 5; ++i) post_chat(router.port());
  auto metrics = http_request(router.port(), "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  std::string path = ::testing::TempDir() + "router_metrics.txt";
  std::ofstream(path) << metrics.body;
  ASSERT_EQ(std::system("command -v promtool >/dev/null"), 0)
      << "promtool not found: run scripts/install-deps.sh (Debian package 'prometheus')";
  std::string command = "promtool check metrics < " + path + " > " + path + ".out 2>&1";
  int status = std::system(command.c_str());
  std::ifstream out(path + ".out");
  std::string report((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 0) << report << "\n" << metrics.body;
  for (const char* name : {"moeserve_router_backend_requests_total", "moeserve_router_backend_failures_total",
                           "moeserve_router_backend_ejections_total", "moeserve_router_backend_in_flight",
                           "moeserve_router_backend_time_to_first_byte_seconds_bucket",
                           "moeserve_router_cache_aware_hit_ratio", "moeserve_router_load_imbalance"})
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
}

}  // namespace
}  // namespace moeserve::router
