// The router against requests meant to hurt: a request that brings its backend down is not passed on to the
// next one (it would bring that one down too), keys are checked before any body is read or parsed, bodies
// that nest without end or hold too many keys are refused without harm, connections and buffered bodies
// have limits, and HTTP/1.1 framing follows RFC 9112. Verdicts never depend on timing: where a test waits,
// the wait is a hang guard.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "router_fixture.h"

namespace moeserve::router {
namespace {

using namespace testing;
using namespace std::chrono_literals;

// Three backends that each read the request and then close the connection without a word when its body says
// "poison", as a server that crashes on it would; they answer anything else with their name.
struct PoisonedBackends {
  static FakeBackend::Handler dies_on_poison(std::string name, bool reset) {
    return [name, reset](const HttpRequest& r, BackendConnection& c) {
      if (r.body.find("poison") != std::string::npos) {
        if (reset)
          c.reset();
        else
          c.hang_up();
        return;
      }
      if (r.target == "/health") {
        c.respond(200, R"({"status":"ok"})");
        return;
      }
      c.respond(200, json{{"backend", name}}.dump());
    };
  }
  explicit PoisonedBackends(bool reset)
      : a(dies_on_poison("a", reset)), b(dies_on_poison("b", reset)), c(dies_on_poison("c", reset)) {}
  std::vector<std::string> urls() const { return {a.url(), b.url(), c.url()}; }
  size_t saw_poison() const {
    size_t n = 0;
    for (const FakeBackend* backend : {&a, &b, &c})
      for (const auto& r : backend->requests()) n += r.body.find("poison") != std::string::npos ? 1 : 0;
    return n;
  }
  FakeBackend a, b, c;
};

std::string poison_body() {
  return chat_body({{"user", "poison"}});
}

void expect_poison_stops_at_its_first_backend(bool reset) {
  PoisonedBackends backends(reset);
  Router router(config_for(backends.urls()));  // least_conn: the first request goes to a
  router.start();
  HttpResponse response = post_chat(router.port(), poison_body());
  EXPECT_EQ(response.status, 502) << response.body;
  EXPECT_NE(response.body.find("not sent to another backend"), std::string::npos) << response.body;
  EXPECT_NE(response.body.find(backends.a.url()), std::string::npos) << response.body;
  EXPECT_EQ(backends.a.request_count(), 1u);
  EXPECT_EQ(backends.b.request_count(), 0u) << "the request a backend dropped was passed on";
  EXPECT_EQ(backends.c.request_count(), 0u) << "the request a backend dropped was passed on";

  auto described = router.balancer().describe();
  EXPECT_EQ(described[0]["state"], "ejected") << described.dump(2);
  std::set<std::string> served;
  for (int i = 0; i < 6; ++i) {
    HttpResponse ok = post_chat(router.port());
    EXPECT_EQ(ok.status, 200) << ok.body;
    served.insert(backend_of(ok));
  }
  EXPECT_EQ(served, (std::set<std::string>{"b", "c"})) << "the backend that dropped a request is out";
  EXPECT_EQ(backends.a.request_count(), 1u);

  // Sent again and again by a client, the poison costs one backend each time it lands, and never more.
  EXPECT_EQ(post_chat(router.port(), poison_body()).status, 502);
  EXPECT_EQ(backends.saw_poison(), 2u);
  std::string metrics = http_request(router.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("moeserve_router_backend_ejections_total{backend=\"" + backends.a.url() +
                         "\",mechanism=\"died\"} 1"),
            std::string::npos)
      << metrics;
}

TEST(RouterHostile, APostTheBackendClosedOnIsAnswered502AndNotSentElsewhere) {
  expect_poison_stops_at_its_first_backend(/*reset=*/false);
}

TEST(RouterHostile, APostTheBackendResetOnIsAnswered502AndNotSentElsewhere) {
  expect_poison_stops_at_its_first_backend(/*reset=*/true);
}

// A POST on a pooled connection that its backend drops is not sent again on a fresh one either.
TEST(RouterHostile, APostDroppedOnAPooledConnectionIsNotSentAgain) {
  PoisonedBackends backends(/*reset=*/false);
  RouterConfig config = config_for({backends.a.url(), backends.b.url()});
  config.workers = 1;  // one pool, which the first request fills
  Router router(config);
  router.start();
  HttpClient client(router.port());
  client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}));
  EXPECT_EQ(backend_of(client.read_response()), "a");
  ASSERT_EQ(backends.a.connections_accepted(), 1u);
  // Ties alternate (smooth round robin): the second request goes to b, the third to a again, over the
  // connection the first one left in the pool.
  client.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}));
  EXPECT_EQ(backend_of(client.read_response()), "b");
  client.send("POST", "/v1/chat/completions", poison_body());
  HttpResponse response = client.read_response();
  EXPECT_EQ(response.status, 502) << response.body;
  EXPECT_EQ(backends.a.connections_accepted(), 1u) << "the POST went again on a fresh connection";
  EXPECT_EQ(backends.saw_poison(), 1u);
}

// With active health checks, a backend that died on a request is out until the checks pass again.
TEST(RouterHostile, ABackendThatDroppedARequestReturnsThroughHealthChecks) {
  PoisonedBackends backends(/*reset=*/false);
  RouterConfig config = config_for({backends.a.url(), backends.b.url()});
  config.health_interval = 100ms;
  config.health_successes = 2;
  Router router(config);
  router.start();
  EXPECT_EQ(post_chat(router.port(), poison_body()).status, 502);
  auto described = router.balancer().describe();
  EXPECT_EQ(described[0]["state"], "unhealthy") << described.dump(2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(backend_of(post_chat(router.port())), "b");
  std::string state;
  for (int i = 0; i < 200 && state != "healthy"; ++i) {  // hang guard: 20 s for two checks 100 ms apart
    std::this_thread::sleep_for(100ms);
    state = router.balancer().describe()[0]["state"];
  }
  EXPECT_EQ(state, "healthy") << "passing health checks must bring the backend back";
}

// ---- authentication -------------------------------------------------------------------------------------

TEST(RouterHostile, EveryPathButTheOpenOnesNeedsTheKey) {
  FakeBackend backend([](const HttpRequest& r, BackendConnection& c) {
    c.respond(200, json{{"path", r.target}}.dump());
  });
  RouterConfig config = config_for({backend.url()});
  config.api_key = "sesame";
  Router router(config);
  router.start();
  std::vector<std::pair<std::string, std::string>> key = {{"Authorization", "Bearer sesame"}};
  for (const char* path : {"/tokenize", "/detokenize", "/v1/tokenize", "/v1/chat/completions", "/anything"}) {
    std::string body = R"({"prompt":"hi"})";
    EXPECT_EQ(http_request(router.port(), "POST", path, body).status, 401) << path;
    for (const char* wrong : {"Bearer sesam", "Bearer sesame!", "Bearer SESAME", "sesame", "Basic sesame"})
      EXPECT_EQ(http_request(router.port(), "POST", path, body, {{"Authorization", wrong}}).status, 401)
          << path << " with " << wrong;
    EXPECT_EQ(http_request(router.port(), "POST", path, body, key).status, 200) << path;
  }
  EXPECT_EQ(backend.request_count(), 5u) << "only requests with the key reach a backend";
  EXPECT_EQ(http_request(router.port(), "GET", "/health").status, 200);
  EXPECT_EQ(http_request(router.port(), "GET", "/metrics").status, 200);
  EXPECT_EQ(http_request(router.port(), "GET", "/backends").status, 200);
  EXPECT_EQ(http_request(router.port(), "GET", "/version").status, 200);
}

// The key is decided from the head: a client without one gets its 401 while its body has not been sent, and
// one that asked to continue never gets a 100.
TEST(RouterHostile, TheKeyIsCheckedBeforeTheBodyIsRead) {
  FakeBackend backend(answer_with("a"));
  RouterConfig config = config_for({backend.url()}, Policy::cache_aware);
  config.api_key = "sesame";
  Router router(config);
  router.start();
  for (bool expect_continue : {false, true}) {
    HttpClient client(router.port());
    client.send_raw(std::string("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n") +
                    (expect_continue ? "Expect: 100-continue\r\n" : "") + "Content-Length: 50000000\r\n\r\n");
    HttpResponse response;
    ASSERT_TRUE(client.read_head(response)) << "the router waited for a body it must not read";
    EXPECT_EQ(response.status, 401);
    EXPECT_TRUE(client.wait_closed()) << "the connection must close: the unread body is in the way";
  }
  EXPECT_EQ(backend.request_count(), 0u);
}

// ---- bodies the router parses -----------------------------------------------------------------------------

std::string nested(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(RouterHostile, DeeplyNestedOrHugeBodiesThroughCacheAwareGet400AndTheRouterStaysUp) {
  FakeBackend backend(answer_with("a"));
  Router router(config_for({backend.url()}, Policy::cache_aware));
  router.start();
  std::string messages = R"("messages":[{"role":"user","content":"hi"}])";
  std::string many_keys = "{" + messages;
  for (int i = 0; i < 200'000; ++i) many_keys += ",\"k" + std::to_string(i) + "\":0";
  many_keys += "}";
  std::vector<std::pair<std::string, std::string>> hostile = {
      {"depth 100000 at the top", nested(100'000)},
      {"depth 100000 in a field", "{" + messages + ",\"tools\":" + nested(100'000) + "}"},
      {"depth 100000 in image_url",
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":)" + nested(100'000) +
           "}]}]}"},
      {"200000 keys", many_keys},
  };
  for (const auto& [what, body] : hostile) {
    for (const char* path : {"/v1/chat/completions", "/tokenize", "/somewhere/else"}) {
      HttpResponse response = http_request(router.port(), "POST", path, body);
      EXPECT_EQ(response.status, 400) << what << " on " << path;
      EXPECT_NE(response.body.find("not valid JSON"), std::string::npos) << what << ": " << response.body;
      EXPECT_LT(response.body.size(), 1000u) << "the error must not echo the body";
    }
  }
  EXPECT_EQ(backend.request_count(), 0u);
  EXPECT_EQ(http_request(router.port(), "GET", "/health").status, 200);
  // Within the limits, nesting and wrongly typed fields route as usual.
  std::string fine = R"({"messages":[{"role":5,"content":[{"type":"image_url","image_url":{"url":7,"x":)" +
                     nested(100) + "}}]}]}";
  EXPECT_EQ(http_request(router.port(), "POST", "/v1/chat/completions", fine).status, 200);
  EXPECT_EQ(http_request(router.port(), "POST", "/upload", "not json at all").status, 200);
}

// ---- limits on connections and buffered bodies ------------------------------------------------------------

TEST(RouterHostile, ConnectionsOverTheLimitGet503WithRetryAfter) {
  FakeBackend backend(answer_with("a"));
  RouterConfig config = config_for({backend.url()});
  config.max_connections = 2;
  Router router(config);
  router.start();
  auto first = std::make_unique<HttpClient>(router.port());
  HttpClient second(router.port());
  // The first two are taken before the third is accepted (one accept loop); a request on the second shows it
  // is being served.
  second.send("POST", "/v1/chat/completions", chat_body({{"user", "hi"}}));
  EXPECT_EQ(second.read_response().status, 200);
  HttpClient third(router.port());
  HttpResponse refused = third.read_response();
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.header("retry-after"), "1");
  EXPECT_NE(refused.body.find("--max-connections"), std::string::npos) << refused.body;
  first.reset();  // one leaves: a new connection is served once the router has noticed
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {  // hang guard
    status = post_chat(router.port()).status;
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);
}

TEST(RouterHostile, BodiesOverTheMemoryBudgetGet503AndAStartedResponseGivesItsShareBack) {
  Gate answer;
  FakeBackend backend([&](const HttpRequest& r, BackendConnection& c) {
    if (r.body.find("hold") != std::string::npos)
      answer.wait(20'000);  // before any response: the router still holds the body
    c.respond(200, R"({"backend":"a"})");
  });
  RouterConfig config = config_for({backend.url()});
  config.max_body_bytes = 10'000;
  config.max_body_memory = 12'000;
  Router router(config);
  router.start();
  auto body = [](const std::string& word) { return chat_body({{"user", word + std::string(7000, 'x')}}); };

  HttpClient held(router.port());
  held.send("POST", "/v1/chat/completions", body("hold"));
  ASSERT_TRUE(backend.wait_requests(1));
  HttpResponse refused = post_chat(router.port(), body("other"));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.header("retry-after"), "1");
  EXPECT_NE(refused.body.find("--max-body-memory"), std::string::npos) << refused.body;
  // A chunked body has no length to check up front; it is refused as it grows past the budget.
  HttpClient chunked(router.port());
  chunked.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  std::string piece(6000, 'y');
  char size[16];
  std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
  chunked.send_raw(size + piece + "\r\n");
  HttpResponse chunked_refused = chunked.read_response();
  EXPECT_EQ(chunked_refused.status, 503) << chunked_refused.body;
  EXPECT_EQ(backend.request_count(), 1u);
  answer.open();
  EXPECT_EQ(held.read_response().status, 200);
  EXPECT_EQ(post_chat(router.port(), body("other")).status, 200) << "the budget was not given back";

  // A stream that has begun needs its body no more: three bodies of 7 KB, each held by a stream that stays
  // open, fit in 12 KB one after the other.
  Gate release;
  FakeBackend streaming([&](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("first"));
    release.wait(20'000);
    c.end_stream();
  });
  config.backends = config_for({streaming.url()}).backends;
  Router stream_router(config);
  stream_router.start();
  std::vector<std::unique_ptr<HttpClient>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(std::make_unique<HttpClient>(stream_router.port()));
    streams.back()->send("POST", "/v1/chat/completions", body("stream"));
    HttpResponse head;
    ASSERT_TRUE(streams.back()->read_head(head));
    EXPECT_EQ(head.status, 200) << "stream " << i;
  }
  release.open();
}

// ---- HTTP/1.1 framing (RFC 9112)
// ---------------------------------------------------------------------------

HttpResponse raw_exchange(uint16_t port, const std::string& bytes) {
  HttpClient client(port);
  client.send_raw(bytes);
  return client.read_response();
}

TEST(RouterHostile, RefusesBadFramingWithAnAnswer) {
  FakeBackend backend(answer_with("a"));
  Router router(config_for({backend.url()}));
  router.start();
  uint16_t port = router.port();
  std::string body = R"({"prompt":"hi"})";
  std::string length = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  EXPECT_EQ(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\n" + length + "\r\n" + body).status, 400)
      << "HTTP/1.1 without Host";
  EXPECT_EQ(
      raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nHost: b\r\n" + length + "\r\n" + body)
          .status,
      400)
      << "two Host fields";
  EXPECT_EQ(raw_exchange(port,
                         "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked"
                         "\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
                .status,
            501);
  EXPECT_EQ(
      raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nhello")
          .status,
      501);
  EXPECT_EQ(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n" +
                                   length + "\r\n" + body)
                .status,
            400)
      << "Transfer-Encoding with Content-Length";
  EXPECT_EQ(raw_exchange(port, "POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                .status,
            400)
      << "a transfer coding in HTTP/1.0";
  EXPECT_EQ(raw_exchange(port,
                         "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "zz\r\nhello\r\n0\r\n\r\n")
                .status,
            400)
      << "a malformed chunk";
  EXPECT_EQ(raw_exchange(
                port, "GET /v1/files HTTP/1.1\r\nHost: a\r\nX-Big: " + std::string(70'000, 'x') + "\r\n\r\n")
                .status,
            431);
  EXPECT_EQ(backend.request_count(), 0u);
  EXPECT_EQ(raw_exchange(port,
                         "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "f\r\n{\"prompt\":\"hi\"}\r\n0\r\n\r\n")
                .status,
            200);
  EXPECT_EQ(raw_exchange(port, "GET /v1/files HTTP/1.0\r\n\r\n").status, 200) << "HTTP/1.0 needs no Host";
  ASSERT_EQ(backend.request_count(), 2u);
  EXPECT_EQ(backend.requests()[0].body, body);
}

TEST(RouterHostile, AStreamToAnHttp10ClientIsNotChunkedAndEndsWithTheConnection) {
  FakeBackend backend([](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("one"));
    c.chunk(sse_event("two"));
    c.end_stream();
  });
  Router router(config_for({backend.url()}));
  router.start();
  HttpClient client(router.port());
  std::string body = chat_body({{"user", "hi"}}, true);
  client.send_raw("POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  HttpResponse response = client.read_response();
  EXPECT_EQ(response.version, "HTTP/1.0");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("transfer-encoding"), "");
  EXPECT_EQ(response.header("content-length"), "");
  EXPECT_TRUE(response.complete) << "the body must end with the connection";
  EXPECT_EQ(response.body, sse_event("one") + sse_event("two"));
}

}  // namespace
}  // namespace moeserve::router
