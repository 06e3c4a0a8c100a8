// The `moeserve route` binary as an operator runs it: memory stays bounded when a client stops reading a
// large stream (backpressure reaches the backend), SIGTERM drains, and a cluster file works in place of
// flags; the API key can come from the environment.
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "http_peer.h"

namespace moeserve::router {
namespace {

using namespace testing;
using namespace std::chrono_literals;

ChildProcess start_router(uint16_t port, const std::vector<std::string>& backends, const std::string& log,
                          std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {MOESERVE_BINARY,      "route",     "--host", "127.0.0.1", "--port",
                                   std::to_string(port), "--workers", "1"};
  for (const auto& b : backends) {
    argv.push_back("--backend");
    argv.push_back(b);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return ChildProcess(argv, {.log_path = ::testing::TempDir() + log});
}

TEST(RouterProcess, MemoryStaysBoundedWhenTheClientStopsReading) {
  constexpr size_t kTotal = size_t{128} << 20;
  constexpr size_t kPiece = 64 << 10;
  std::atomic<size_t> sent{0};
  FakeBackend firehose([&](const HttpRequest&, BackendConnection& c) {
    c.start_stream(200, "application/octet-stream");
    std::string piece(kPiece, 'x');
    for (size_t done = 0; done < kTotal; done += kPiece) {
      if (!c.chunk(piece)) return;
      sent += kPiece;
    }
    c.end_stream();
  });
  uint16_t port = free_port();
  ChildProcess router = start_router(port, {firehose.url()}, "router-memory.log");
  ASSERT_TRUE(wait_listening(port));

  HttpClient client(port, /*receive_buffer=*/64 << 10);
  client.send("GET", "/big");
  HttpResponse response;
  ASSERT_TRUE(client.read_head(response));
  // The client reads nothing more. Wait until the backend cannot send any further (its writes block). Kernel
  // socket buffers on the way (up to tcp_rmem's 32 MiB on the router's side) still take some; a router that
  // buffered would let the backend send all of it within a second.
  size_t last = 0;
  for (int stable = 0, i = 0; stable < 5 && i < 60; ++i) {
    std::this_thread::sleep_for(100ms);
    size_t now = sent.load();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
  // Bytes, not RSS (which other processes' load makes noisy): what the backend could send is what the router
  // holds plus the kernel's buffers, so a router that buffered would have let all 128 MiB through.
  EXPECT_LT(sent.load(), size_t{64} << 20)
      << "the router kept reading from the backend for a client that reads nothing";

  size_t received = response.body.size();
  while (auto piece = client.read_chunk(response)) {
    received += piece->size();
    response.body.clear();  // keep the test's own memory small
  }
  EXPECT_TRUE(response.complete);
  EXPECT_EQ(received, kTotal);
}

TEST(RouterProcess, SigtermLetsStreamsInFlightFinishThenExits) {
  Gate release;
  FakeBackend slow([&](const HttpRequest&, BackendConnection& c) {
    c.start_stream();
    c.chunk(sse_event("one"));
    release.wait();
    c.chunk(sse_event("two"));
    c.chunk("data: [DONE]\n\n");
    c.end_stream();
  });
  uint16_t port = free_port();
  ChildProcess router = start_router(port, {slow.url()}, "router-drain.log", {"--shutdown-timeout", "20s"});
  ASSERT_TRUE(wait_listening(port));
  HttpClient client(port);
  client.send("POST", "/v1/chat/completions", R"({"model":"m","stream":true,"messages":[]})");
  HttpResponse response;
  ASSERT_TRUE(client.read_head(response));
  ASSERT_TRUE(client.read_chunk(response));
  router.signal(SIGTERM);
  // Draining: no new connections are accepted...
  bool refused = false;
  for (int i = 0; i < 600 && !refused; ++i) {  // a hang guard, not a bound: 30 s
    HttpClient probe(port);
    refused = !probe.connected();
    if (!refused) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(refused);
  EXPECT_TRUE(router.running()) << "the router must wait for the stream in flight";
  // ...and the stream in flight completes.
  release.open();
  while (client.read_chunk(response)) {
  }
  EXPECT_TRUE(response.complete);
  EXPECT_NE(response.body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(router.wait_exit(10s), 0);
}

// What serve's streams look like, with the fields the router's ending copies.
const std::string kFirstChatEvent =
    R"(data: {"id":"chatcmpl-42","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,)"
    R"("delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})"
    "\n\n";

// Past --shutdown-timeout a stream still in flight ends as serve ends one at its own deadline (a chunk with
// finish_reason "abort" of the same id, then [DONE]), and a request still waiting for its response head gets
// a 503; neither is passed to another backend nor cut.
TEST(RouterProcess, AtTheShutdownDeadlineStreamsEndWithAbortAndDone) {
  Gate release;
  FakeBackend slow([&](const HttpRequest& request, BackendConnection& c) {
    if (!request.target.starts_with("/v1/c")) {  // the router's health checks
      c.respond(200, "{}");
      return;
    }
    if (request.target == "/v1/completions") {  // no response head before the deadline
      release.wait(120'000);
      c.respond(200, R"({"object":"text_completion"})");
      return;
    }
    c.start_stream();
    c.chunk(kFirstChatEvent);
    c.chunk(sse_event("one"));
    release.wait(120'000);
    c.chunk(sse_event("late"));
    c.end_stream();
  });
  uint16_t port = free_port();
  ChildProcess router = start_router(port, {slow.url()}, "router-deadline.log", {"--shutdown-timeout", "1s"});
  ASSERT_TRUE(wait_listening(port));
  HttpClient streaming(port), waiting(port);
  streaming.send("POST", "/v1/chat/completions", R"({"model":"m","stream":true,"messages":[]})");
  waiting.send("POST", "/v1/completions", R"({"model":"m","prompt":"hi"})");
  HttpResponse stream;
  ASSERT_TRUE(streaming.read_head(stream, 60'000));
  while (stream.body.find("one") == std::string::npos) ASSERT_TRUE(streaming.read_chunk(stream, 60'000));
  ASSERT_TRUE(slow.wait_requests(2, 60'000));
  router.signal(SIGTERM);

  while (streaming.read_chunk(stream, 60'000)) {
  }
  release.open();
  EXPECT_TRUE(stream.complete) << stream.body;
  EXPECT_EQ(stream.body, kFirstChatEvent + sse_event("one") +
                             R"(data: {"id":"chatcmpl-42","object":"chat.completion.chunk","created":7,)"
                             R"("model":"m","choices":[{"index":0,"delta":{},"logprobs":null,)"
                             R"("finish_reason":"abort","stop_reason":null}]})"
                             "\n\ndata: [DONE]\n\n");
  HttpResponse refused = waiting.read_response(60'000);
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("shutting down"), std::string::npos) << refused.body;
  EXPECT_EQ(slow.request_count(), 2u) << "a request the deadline ended went to the backend again";
  EXPECT_EQ(router.wait_exit(60s), 0);
}

// A second SIGTERM moves the deadline to now (as serve's does). While draining, a request on a connection
// kept alive from before is refused with a 503; the endings cover every choice of a completion (n per
// prompt).
TEST(RouterProcess, ASecondSigtermEndsStreamsAtOnceAndDrainingRefusesNewRequests) {
  Gate release;
  FakeBackend slow([&](const HttpRequest& request, BackendConnection& c) {
    if (request.target != "/v1/completions") {  // the router's health checks
      c.respond(200, "{}");
      return;
    }
    c.start_stream();
    c.chunk(
        R"(data: {"id":"cmpl-9","object":"text_completion","created":3,"model":"m","choices":[{"index":1,)"
        R"("text":"a","logprobs":null,"finish_reason":null}]})"
        "\n\n");
    release.wait(120'000);
    c.end_stream();
  });
  uint16_t port = free_port();
  ChildProcess router = start_router(port, {slow.url()}, "router-second.log", {"--shutdown-timeout", "300s"});
  ASSERT_TRUE(wait_listening(port));
  HttpClient kept(port);
  kept.send("GET", "/backends");
  EXPECT_EQ(kept.read_response(60'000).status, 200);
  HttpClient streaming(port);
  streaming.send("POST", "/v1/completions", R"({"model":"m","stream":true,"n":2,"prompt":["a","b"]})");
  HttpResponse stream;
  ASSERT_TRUE(streaming.read_head(stream, 60'000));
  ASSERT_TRUE(streaming.read_chunk(stream, 60'000));
  router.signal(SIGTERM);
  bool refused = false;
  for (int i = 0; i < 600 && !refused; ++i) {
    HttpClient probe(port);
    refused = !probe.connected();
    if (!refused) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(refused) << "the router still accepts connections after SIGTERM";
  kept.send("POST", "/v1/completions", R"({"model":"m","prompt":"x"})");
  HttpResponse late = kept.read_response(60'000);
  EXPECT_EQ(late.status, 503) << late.body;
  EXPECT_NE(late.body.find("accepts no new requests"), std::string::npos) << late.body;
  EXPECT_EQ(slow.request_count(), 1u);

  router.signal(SIGTERM);
  while (streaming.read_chunk(stream, 60'000)) {
  }
  release.open();
  EXPECT_TRUE(stream.complete) << stream.body;
  std::string endings;
  for (int index = 0; index < 4; ++index)
    endings +=
        R"(data: {"id":"cmpl-9","object":"text_completion","created":3,"model":"m","choices":[{"index":)" +
        std::to_string(index) +
        R"(,"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null}]})"
        "\n\n";
  EXPECT_TRUE(stream.body.ends_with(endings + "data: [DONE]\n\n")) << stream.body;
  EXPECT_EQ(router.wait_exit(60s), 0);
}

TEST(RouterProcess, ReadsAClusterFile) {
  FakeBackend a([](const HttpRequest&, BackendConnection& c) { c.respond(200, R"({"backend":"a"})"); });
  uint16_t port = free_port();
  std::string path = ::testing::TempDir() + "router-cluster.yaml";
  std::ofstream(path) << "router:\n  host: 127.0.0.1\n  port: " << port
                      << "\n  policy: round_robin\n  health_interval: 0\nbackends:\n  - " << a.url() << "\n";
  ChildProcess router({MOESERVE_BINARY, "route", "--config", path},
                      {.log_path = ::testing::TempDir() + "router-config.log"});
  ASSERT_TRUE(wait_listening(port));
  auto response = http_request(port, "POST", "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, R"({"backend":"a"})");
  router.signal(SIGTERM);
  EXPECT_EQ(router.wait_exit(10s), 0);
}

// The key can come from MOESERVE_API_KEY, so that it shows neither in `ps` nor in a unit file; a --api-key
// flag wins over it. The router also raises its open-file limit for --max-connections.
TEST(RouterProcess, TakesTheApiKeyFromTheEnvironmentAndTheFlagWins) {
  FakeBackend a([](const HttpRequest&, BackendConnection& c) { c.respond(200, R"({"backend":"a"})"); });
  auto status_with = [](uint16_t port, const std::string& key) {
    return http_request(port, "POST", "/v1/completions", R"({"prompt":"hi"})",
                        {{"Authorization", "Bearer " + key}})
        .status;
  };
  ::setenv("MOESERVE_API_KEY", "from-env", 1);
  uint16_t env_port = free_port();
  ChildProcess env_router = start_router(env_port, {a.url()}, "router-env-key.log");
  uint16_t flag_port = free_port();
  ChildProcess flag_router =
      start_router(flag_port, {a.url()}, "router-flag-key.log", {"--api-key", "from-flag"});
  ::unsetenv("MOESERVE_API_KEY");
  ASSERT_TRUE(wait_listening(env_port));
  ASSERT_TRUE(wait_listening(flag_port));
  EXPECT_EQ(http_request(env_port, "POST", "/v1/completions", R"({"prompt":"hi"})").status, 401);
  EXPECT_EQ(status_with(env_port, "from-env"), 200);
  EXPECT_EQ(status_with(flag_port, "from-env"), 401);
  EXPECT_EQ(status_with(flag_port, "from-flag"), 200);

  std::ifstream limits("/proc/" + std::to_string(env_router.pid()) + "/limits");
  std::string line;
  long soft = -1, hard = -1;
  while (std::getline(limits, line))
    if (line.rfind("Max open files", 0) == 0) std::sscanf(line.c_str() + 14, "%ld %ld", &soft, &hard);
  EXPECT_GE(soft, std::min(hard, 2L * 4096 + 1024)) << "the soft limit on open files was not raised";
  env_router.signal(SIGTERM);
  flag_router.signal(SIGTERM);
  EXPECT_EQ(env_router.wait_exit(10s), 0);
  EXPECT_EQ(flag_router.wait_exit(10s), 0);
}

TEST(RouterProcess, RefusesABadConfigurationWithAReason) {
  ChildProcess router({MOESERVE_BINARY, "route", "--backend", "https://x:1"},
                      {.log_path = ::testing::TempDir() + "router-bad.log"});
  EXPECT_EQ(router.wait_exit(10s), 1);
  EXPECT_NE(router.output().find("only http://"), std::string::npos) << router.output();
}

}  // namespace
}  // namespace moeserve::router
