// The same traffic through the real nginx, configured as the reference deployment configures it (least_conn,
// max_fails=3 fail_timeout=30s, keepalive 32, proxy_buffering off, 300 s timeouts), and through
// `moeserve route` with the same settings: every request must land on the same backend. The traffic holds
// streams open and releases some, so least_conn's counts and its tie-breaking both matter, and one backend is
// down (connection refused) so that retries and the max_fails ejection matter too.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include "http_peer.h"

namespace moeserve::router {
namespace {

using namespace testing;
namespace fs = std::filesystem;

struct Backends {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Gate>> gates;  // per request id: released by the test
  std::vector<std::unique_ptr<FakeBackend>> live;
  uint16_t dead_port = free_port();

  std::shared_ptr<Gate> gate(const std::string& id) {
    std::lock_guard lock(mu);
    auto& g = gates[id];
    if (!g) g = std::make_shared<Gate>();
    return g;
  }

  Backends() {
    for (std::string name : {"a", "b", "c"}) {
      live.push_back(std::make_unique<FakeBackend>(
          [this, name](const HttpRequest& r, BackendConnection& c) {
            if (r.header("x-test-stream") == "1") {
              c.start_stream();
              c.chunk("data: {\"backend\":\"" + name + "\"}\n\n");
              gate(r.header("x-test-id"))->wait(20'000);
              c.chunk("data: [DONE]\n\n");
              c.end_stream();
            } else {
              c.respond(200, "{\"backend\":\"" + name + "\"}");
            }
          },
          name));
    }
  }

  // Upstream order as in the proxy's configuration: a, dead, b, c.
  std::vector<std::string> urls() const {
    return {live[0]->url(), "http://127.0.0.1:" + std::to_string(dead_port), live[1]->url(), live[2]->url()};
  }

  std::string served(const std::string& id) const {
    std::string out;
    for (const auto& backend : live)
      for (const auto& r : backend->requests())
        if (r.header("x-test-id") == id) out += backend->name();
    return out.empty() ? "none" : out;
  }
};

// Sends the scripted traffic; returns which backend served each request, in order.
std::vector<std::string> drive(uint16_t port, Backends& backends, const std::string& run) {
  std::vector<std::string> ids;
  std::map<std::string, std::unique_ptr<HttpClient>> open;
  auto start_stream = [&](int n) {
    std::string id = run + "-" + std::to_string(n);
    ids.push_back(id);
    auto client = std::make_unique<HttpClient>(port);
    client->send("POST", "/v1/chat/completions", R"({"model":"m","stream":true,"messages":[]})",
                 {{"X-Test-Id", id}, {"X-Test-Stream", "1"}});
    HttpResponse head;
    EXPECT_TRUE(client->read_head(head)) << id;
    EXPECT_EQ(head.status, 200) << id;
    client->read_chunk(head);  // the backend has it and holds it open
    open[id] = std::move(client);
  };
  auto finish_stream = [&](int n) {
    std::string id = run + "-" + std::to_string(n);
    backends.gate(id)->open();
    HttpResponse rest;
    rest.status = 200;
    while (open[id]->read_chunk(rest)) {
    }
    open.erase(id);
  };
  for (int n = 0; n < 6; ++n) start_stream(n);
  finish_stream(1);
  finish_stream(4);
  finish_stream(5);
  for (int n = 6; n < 11; ++n) start_stream(n);
  finish_stream(0);
  finish_stream(7);
  for (int n = 11; n < 14; ++n) start_stream(n);
  for (int n : {2, 3, 6, 8, 9, 10, 11, 12, 13}) finish_stream(n);
  for (int n = 14; n < 20; ++n) {
    std::string id = run + "-" + std::to_string(n);
    ids.push_back(id);
    auto response = http_request(port, "POST", "/v1/chat/completions", R"({"model":"m","messages":[]})",
                                 {{"X-Test-Id", id}});
    EXPECT_EQ(response.status, 200) << id;
  }
  std::vector<std::string> served;
  for (const auto& id : ids) served.push_back(backends.served(id));
  return served;
}

std::vector<std::string> through_nginx(Backends& backends, bool least_conn) {
  EXPECT_EQ(std::system("test -x /usr/sbin/nginx"), 0)
      << "nginx not found: run scripts/install-deps.sh (Debian package 'nginx')";
  fs::path dir = fs::path(::testing::TempDir()) / ("router-nginx-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  uint16_t port = free_port();
  std::ofstream(dir / "nginx.conf") << nginx_reference_config(dir.string(), port, backends.urls(),
                                                              least_conn);
  ChildProcess nginx({"/usr/sbin/nginx", "-p", dir.string(), "-e", (dir / "error.log").string(), "-c",
                      (dir / "nginx.conf").string()},
                     {.log_path = (dir / "stdout.log").string()});
  EXPECT_TRUE(wait_listening(port)) << "nginx did not start; see " << dir;
  auto served = drive(port, backends, "nginx");
  nginx.signal(SIGQUIT);
  nginx.wait_exit(std::chrono::seconds(10));
  return served;
}

std::vector<std::string> through_router(Backends& backends, bool least_conn) {
  uint16_t port = free_port();
  std::vector<std::string> argv = {
      MOESERVE_BINARY, "route", "--host", "127.0.0.1", "--port", std::to_string(port), "--policy",
      least_conn ? "least_conn" : "round_robin", "--max-fails", "3", "--fail-timeout", "30s", "--keepalive",
      "32", "--keepalive-timeout", "300s", "--read-timeout", "300s", "--send-timeout", "300s",
      // nginx (open source) has no active health checks: compare passive detection
      "--health-interval", "0"};
  for (const auto& url : backends.urls()) {
    argv.push_back("--backend");
    argv.push_back(url);
  }
  ChildProcess router(argv, {.log_path = ::testing::TempDir() + "router-compare.log"});
  EXPECT_TRUE(wait_listening(port)) << "moeserve route did not start";
  auto served = drive(port, backends, "route");
  router.signal(SIGTERM);
  EXPECT_EQ(router.wait_exit(std::chrono::seconds(10)), 0);
  return served;
}

class NginxComparison : public ::testing::TestWithParam<bool> {};

TEST_P(NginxComparison, RoutesTheSameTrafficToTheSameBackends) {
  bool least_conn = GetParam();
  Backends for_nginx;
  auto nginx = through_nginx(for_nginx, least_conn);
  Backends for_router;
  auto router = through_router(for_router, least_conn);
  ASSERT_EQ(nginx.size(), 20u);
  std::string sequence;
  for (const auto& served : nginx) sequence += served;
  RecordProperty("nginx_sequence", sequence);  // e.g. "abcabc..." in the test's XML report
  EXPECT_EQ(router, nginx);
  for (const auto& served : router) EXPECT_NE(served, "none");
}

INSTANTIATE_TEST_SUITE_P(Policies, NginxComparison, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "least_conn" : "round_robin"; });

}  // namespace
}  // namespace moeserve::router
