// End to end on loopback with the real `moeserve serve`, `moeserve route` and nginx: the local cluster
// starts, serves through its router and stops with nothing left running; a plan's generated launch script,
// router config and nginx.conf serve a real node; the dashboard and alerts read only series the server and
// router export on /metrics.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/utsname.h>

#include <filesystem>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "deploy/local_cluster.h"
#include "deploy/plan.h"
#include "deploy/structured_file.h"
#include "router/config.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using namespace testing;
using std::chrono::seconds;

const std::string kChat =
    R"({"model":"demo","max_tokens":8,"messages":[{"role":"user","content":"Say hello"}]})";

// Metric families a /metrics page declares (# TYPE lines).
std::set<std::string> declared_metrics(int port) {
  std::set<std::string> out;
  std::string page = http_request(port, "GET", "/metrics", "", {}, 10'000).body;
  static const std::regex type(R"(# TYPE (\S+) )");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), type); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1]);
  return out;
}

TEST(LocalCluster, UpServesThroughTheRouterAndDownLeavesNothing) {
  TempDir dir;
  int base = peers::free_port_pair(), router = free_port();
  std::string bin = MOESERVE_BINARY;
  auto up =
      run_command(fmt::format("{} cluster up --local 2 --model demo --base-port {} --router-port {} --dir {} "
                              "--timeout 600",
                              bin, base, router, dir.path()));
  ASSERT_EQ(up.status, 0) << up.output;
  LocalClusterState state = LocalClusterState::load(dir.path());
  ASSERT_EQ(state.processes.size(), 3u);
  for (const auto& p : state.processes) EXPECT_TRUE(process_alive(p.pid, p.start_time)) << p.name;

  auto status = run_command(fmt::format("{} cluster status --dir {}", bin, dir.path()));
  EXPECT_EQ(status.status, 0) << status.output;
  int ready = 0;
  for (size_t at = 0; (at = status.output.find(" ready ", at)) != std::string::npos; ++at) ++ready;
  EXPECT_EQ(ready, 3) << status.output;

  // Requests through the router reach the servers.
  for (int i = 0; i < 4; ++i) {
    HttpResponse r = http_request(router, "POST", "/v1/chat/completions", kChat, {}, 120'000);
    ASSERT_EQ(r.status, 200) << r.body;
    auto j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
  }
  // Both servers got work (least_conn spreads sequential requests round the idle nodes).
  auto backends = nlohmann::json::parse(http_request(router, "GET", "/backends", "", {}, 10'000).body);
  ASSERT_EQ(backends.size(), 2u) << backends.dump(2);
  for (const auto& b : backends) EXPECT_EQ(b["requests"], 2) << backends.dump(2);

  // Every series the generated dashboard and alerts read is declared on a server's or the router's /metrics.
  std::set<std::string> exported = declared_metrics(state.processes[0].port);
  auto routed = declared_metrics(router);
  exported.insert(routed.begin(), routed.end());
  ASSERT_GT(exported.size(), 20u);
  Plan plan = make_plan(ClusterSpec::load("deploy/cluster-spark9.yaml"));
  for (const auto& f : plan.files) {
    if (f.path != "monitoring/grafana-dashboard.json" && f.path != "monitoring/alerts.yml") continue;
    for (const auto& name : metrics_in(f.content))
      EXPECT_TRUE(exported.count(name)) << name << " (used in " << f.path << ") is not exported";
  }

  auto down = run_command(fmt::format("{} cluster down --dir {}", bin, dir.path()));
  EXPECT_EQ(down.status, 0) << down.output;
  for (const auto& p : state.processes)
    EXPECT_FALSE(process_alive(p.pid, p.start_time)) << p.name << " survived";
  EXPECT_FALSE(fs::exists(dir / "cluster.json"));
  EXPECT_TRUE(fs::exists(dir / "node-1.log"));  // logs stay
}

// `cluster down` while a long stream is in flight through the router: the client's stream ends as a stream
// should (a finish_reason, then [DONE], then the last chunk), whether it finished or the deadline aborted it;
// every process exits by itself (each logs its last line), none is killed.
TEST(LocalCluster, DownEndsStreamsInFlightWithAFinishReasonAndDone) {
  TempDir dir;
  int base = free_port(), router = free_port();
  std::string bin = MOESERVE_BINARY;
  // The processes' own deadline is far: here `down --timeout` decides.
  auto up =
      run_command(fmt::format("{} cluster up --local 1 --model demo --base-port {} --router-port {} --dir {} "
                              "--timeout 600 --shutdown-timeout 600",
                              bin, base, router, dir.path()));
  ASSERT_EQ(up.status, 0) << up.output;
  LocalClusterState state = LocalClusterState::load(dir.path());
  EXPECT_EQ(state.shutdown_timeout, 600);

  // Tens of thousands of tokens: the stream is still going when the router's deadline comes.
  HttpClient stream(router);
  stream.send("POST", "/v1/chat/completions",
              R"({"model":"demo","stream":true,"max_tokens":30000,"ignore_eos":true,)"
              R"("messages":[{"role":"user","content":"Count to a million"}]})");
  HttpResponse response;
  ASSERT_TRUE(stream.read_head(response, 300'000));
  while (response.body.find(R"("content":")") == std::string::npos)
    ASSERT_TRUE(stream.read_chunk(response, 300'000)) << response.status << " " << response.body;
  auto down = std::async(std::launch::async, [&] {
    return run_command(fmt::format("{} cluster down --dir {} --timeout 1", bin, dir.path()));
  });
  while (stream.read_chunk(response, 300'000)) {
  }
  auto result = down.get();
  EXPECT_EQ(result.status, 0) << result.output;

  ASSERT_EQ(response.status, 200) << response.body.substr(0, 2000);
  ASSERT_NE(response.header("content-type").find("text/event-stream"), std::string::npos);
  const std::string& events = response.body;
  EXPECT_TRUE(response.complete) << "the stream was cut: "
                                 << events.substr(events.size() > 2000 ? events.size() - 2000 : 0);
  ASSERT_TRUE(events.ends_with("\n\ndata: [DONE]\n\n"))
      << events.substr(events.size() > 2000 ? events.size() - 2000 : 0);
  // Every event is whole JSON; the last before [DONE] ends the choice.
  std::vector<nlohmann::json> chunks;
  for (size_t at = 0; at < events.size();) {
    size_t end = events.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    std::string event = events.substr(at, end - at);
    at = end + 2;
    ASSERT_TRUE(event.starts_with("data: ")) << event;
    if (event == "data: [DONE]") break;
    chunks.push_back(nlohmann::json::parse(event.substr(6)));
  }
  ASSERT_GE(chunks.size(), 2u);
  const auto& last = chunks.back();
  EXPECT_EQ(last["id"], chunks.front()["id"]);
  EXPECT_EQ(last["object"], "chat.completion.chunk");
  EXPECT_EQ(last["model"], "demo");
  std::string reason = last["choices"][0]["finish_reason"].get<std::string>();
  EXPECT_TRUE(reason == "abort" || reason == "length") << last.dump();
  std::cout << "stream ended with finish_reason " << reason << " after " << chunks.size() << " chunks\n";

  for (const auto& p : state.processes)
    EXPECT_FALSE(process_alive(p.pid, p.start_time)) << p.name << " survived";
  EXPECT_NE(read_file(dir / "router.log").find("route: stopped"), std::string::npos)
      << read_file(dir / "router.log");
  EXPECT_NE(read_file(dir / "node-1.log").find("] stopped"), std::string::npos)
      << read_file(dir / "node-1.log");
  EXPECT_FALSE(fs::exists(dir / "cluster.json"));
}

TEST(LocalCluster, RefusesBusyPortsAndMissingState) {
  TempDir dir;
  uint16_t port = 0;
  int fd = peers::listen_loopback(port, 1);
  auto up = run_command(fmt::format("{} cluster up --local 1 --base-port {} --router-port {} --dir {}",
                                    MOESERVE_BINARY, port, free_port(), dir.path()));
  ::close(fd);
  EXPECT_EQ(up.status, 1);
  EXPECT_NE(up.output.find(fmt::format("port {} on 127.0.0.1 is in use", port)), std::string::npos)
      << up.output;
  auto status = run_command(fmt::format("{} cluster status --dir {}", MOESERVE_BINARY, dir.path()));
  EXPECT_EQ(status.status, 1);
  EXPECT_NE(status.output.find("no local cluster in"), std::string::npos) << status.output;
}

// The files a plan writes, run for real: serve.sh starts a node, router.yaml configures `moeserve route`, and
// nginx.conf proxies to the same node; both front doors answer and stream.
TEST(PlanLoopback, GeneratedLaunchRouterAndNginxServeARealNode) {
  std::string nginx = find_tool("nginx");
  ASSERT_FALSE(nginx.empty())
      << "nginx is missing: install the Debian package 'nginx' (scripts/install-deps.sh)";
  utsname u{};
  ::uname(&u);
  int node_port = free_port(), router_port = free_port(), nginx_port = free_port();
  std::string yaml = fmt::format(R"(
cluster: loopback
nodes: [{{name: local, host: 127.0.0.1, gpu: cpu, arch: {}, memory: 2GB}}]
models:
  - {{name: demo, path: demo, config: tests/fixtures/models/tiny-moe/config.json, max_model_len: 2048, mem_fraction: 0.62,
     max_running_requests: 4, port: {}, router_port: {}, nodes: [local]}}
router: {{host: 127.0.0.1, listen: 127.0.0.1, port: {}, health_interval: 1s}}
monitoring: {{prometheus_port: {}, grafana_port: {}}}
install: {{shutdown_timeout: 5s}}
)",
                                 u.machine, node_port, nginx_port, router_port, free_port(), free_port());
  ClusterSpec c = ClusterSpec::parse(parse_structured_text(yaml, "loopback.yaml"), "loopback.yaml", ".");
  c.install.binary = MOESERVE_BINARY;
  Plan p = make_plan(c);
  TempDir dir;
  write_plan(p, dir.path());

  // The router config is also what the router's own parser accepts.
  auto rc = router::load_config_file(dir / "router/router.yaml");
  EXPECT_NO_THROW(router::validate(rc));
  ASSERT_EQ(rc.backends.size(), 1u);
  EXPECT_EQ(rc.backends[0].url, fmt::format("http://127.0.0.1:{}", node_port));

  // serve.sh runs from the source root (the demo model's tokenizer is under .cache/).
  // Stopped as a service manager stops them (SIGTERM), so that each cleans up.
  auto logged_in_dir = [&](const std::string& log) {
    return ChildOptions{.log_path = dir / log, .stop_signal = SIGTERM};
  };
  ChildProcess node({"bash", dir / "nodes/local/serve.sh"}, logged_in_dir("node.log"));
  ASSERT_TRUE(wait_http_ok(node_port, "/health", &node, seconds(600))) << node.output();
  ChildProcess route({"bash", dir / "router/route.sh"}, logged_in_dir("router.log"));
  ASSERT_TRUE(wait_http_ok(router_port, "/health", &route, seconds(60))) << route.output();
  fs::create_directories(dir / "nginx");
  ChildProcess proxy(
      {nginx, "-p", dir / "nginx", "-c", dir / "router/nginx.conf", "-e", "stderr", "-g", "daemon off;"},
      logged_in_dir("nginx.log"));
  ASSERT_TRUE(wait_http_ok(nginx_port, "/v1/models", &proxy, seconds(30))) << proxy.output();

  for (int port : {router_port, nginx_port}) {
    HttpResponse r = http_request(port, "POST", "/v1/chat/completions", kChat, {}, 120'000);
    ASSERT_EQ(r.status, 200) << "port " << port << "\n" << r.body;
    EXPECT_EQ(nlohmann::json::parse(r.body)["choices"].size(), 1u);
    std::string streamed =
        R"({"model":"demo","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hi"}]})";
    HttpResponse s = http_request(port, "POST", "/v1/chat/completions", streamed, {}, 120'000);
    EXPECT_NE(s.header("content-type").find("text/event-stream"), std::string::npos) << s.body;
    EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos) << s.body;
  }
}

}  // namespace
}  // namespace moeserve::deploy
