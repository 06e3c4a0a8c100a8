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

// Two free loopback ports next to each other (cluster up numbers its servers from a base port).
int free_port_pair() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    int p = free_port();
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(uint16_t(p + 1));
    bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (ok && p + 1 < 65536) return p;
  }
  return free_port();
}

std::string body_of(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// A request whose response is read as it arrives. Time limits only guard against a hang.
class StreamingExchange {
 public:
  StreamingExchange(int port, const std::string& request) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(uint16_t(port));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
      ::send(fd_, request.data(), request.size(), MSG_NOSIGNAL);
  }
  ~StreamingExchange() { ::close(fd_); }
  // Reads until the response so far contains `text` (true), or the connection ends (false).
  bool read_until(const std::string& text, seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (got_.find(text) == std::string::npos)
      if (!read_more(deadline)) return false;
    return true;
  }
  void read_to_end(seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (read_more(deadline)) {
    }
  }
  const std::string& response() const { return got_; }

 private:
  bool read_more(std::chrono::steady_clock::time_point deadline) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return false;
    char buf[8192];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got_.append(buf, size_t(n));
    return true;
  }

  int fd_ = -1;
  std::string got_;
};

// The body of a chunked response; `complete` tells whether it ended with its last chunk (not cut).
std::string dechunk(const std::string& body, bool& complete) {
  std::string out;
  complete = false;
  for (size_t at = 0;;) {
    size_t line_end = body.find("\r\n", at);
    if (line_end == std::string::npos) return out;
    size_t size = std::stoul(body.substr(at, line_end - at), nullptr, 16);
    if (size == 0) {
      complete = body.compare(line_end, 4, "\r\n\r\n") == 0;
      return out;
    }
    if (line_end + 2 + size + 2 > body.size()) return out;
    out += body.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
}

// Metric families a /metrics page declares (# TYPE lines).
std::set<std::string> declared_metrics(int port) {
  std::set<std::string> out;
  std::string page = body_of(http_exchange(port, get("/metrics"), seconds(10)));
  static const std::regex type(R"(# TYPE (\S+) )");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), type); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1]);
  return out;
}

std::set<std::string> metrics_in(const std::string& text) {
  std::set<std::string> out;
  static const std::regex ident(R"((moeserve:[A-Za-z0-9_:]+|moeserve_router_[A-Za-z0-9_]+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ident); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.ends_with(suffix) && name.find("_seconds") != std::string::npos)
        name = name.substr(0, name.size() - std::strlen(suffix));
    out.insert(name);
  }
  return out;
}

TEST(LocalCluster, UpServesThroughTheRouterAndDownLeavesNothing) {
  TempDir dir;
  int base = free_port_pair(), router = free_port();
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
    std::string r = http_exchange(router, post_json("/v1/chat/completions", kChat), seconds(120));
    ASSERT_TRUE(r.starts_with("HTTP/1.1 200")) << r;
    auto j = nlohmann::json::parse(body_of(r));
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
  }
  // Both servers got work (least_conn spreads sequential requests round the idle nodes).
  auto backends = nlohmann::json::parse(body_of(http_exchange(router, get("/backends"), seconds(10))));
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
  StreamingExchange stream(router,
                           post_json("/v1/chat/completions",
                                     R"({"model":"demo","stream":true,"max_tokens":30000,"ignore_eos":true,)"
                                     R"("messages":[{"role":"user","content":"Count to a million"}]})"));
  ASSERT_TRUE(stream.read_until(R"("content":")", seconds(300))) << stream.response();
  auto down = std::async(std::launch::async, [&] {
    return run_command(fmt::format("{} cluster down --dir {} --timeout 1", bin, dir.path()));
  });
  stream.read_to_end(seconds(300));
  auto result = down.get();
  EXPECT_EQ(result.status, 0) << result.output;

  const std::string& response = stream.response();
  ASSERT_TRUE(response.starts_with("HTTP/1.1 200")) << response.substr(0, 2000);
  ASSERT_NE(response.find("text/event-stream"), std::string::npos);
  bool complete = false;
  std::string events = dechunk(body_of(response), complete);
  EXPECT_TRUE(complete) << "the stream was cut: "
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
  int port = free_port();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::listen(fd, 1);
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
  ChildProcess node({"bash", dir / "nodes/local/serve.sh"}, dir / "node.log");
  ASSERT_TRUE(wait_ready(node_port, "/health", &node, seconds(600))) << read_file(dir / "node.log");
  ChildProcess route({"bash", dir / "router/route.sh"}, dir / "router.log");
  ASSERT_TRUE(wait_ready(router_port, "/health", &route, seconds(60))) << read_file(dir / "router.log");
  fs::create_directories(dir / "nginx");
  ChildProcess proxy(
      {nginx, "-p", dir / "nginx", "-c", dir / "router/nginx.conf", "-e", "stderr", "-g", "daemon off;"},
      dir / "nginx.log");
  ASSERT_TRUE(wait_ready(nginx_port, "/v1/models", &proxy, seconds(30))) << read_file(dir / "nginx.log");

  for (int port : {router_port, nginx_port}) {
    std::string r = http_exchange(port, post_json("/v1/chat/completions", kChat), seconds(120));
    ASSERT_TRUE(r.starts_with("HTTP/1.1 200")) << "port " << port << "\n" << r;
    EXPECT_EQ(nlohmann::json::parse(body_of(r))["choices"].size(), 1u);
    std::string streamed =
        R"({"model":"demo","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hi"}]})";
    std::string s = http_exchange(port, post_json("/v1/chat/completions", streamed), seconds(120));
    EXPECT_NE(s.find("text/event-stream"), std::string::npos) << s;
    EXPECT_NE(s.find("data: [DONE]"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace moeserve::deploy
