// The generated files, checked by the real tools operators run them with: promtool (config, rules and a
// rules unit test with synthetic series), nginx (-t, and live in front of a streaming backend), and
// systemd-analyze verify. A missing tool fails the test: scripts/install-deps.sh installs them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "deploy/metric_names.h"
#include "deploy/plan.h"
#include "deploy/structured_file.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

using testing::find_tool;
using testing::metrics_in;
using testing::read_file;
using testing::run_command;
using testing::TempDir;
using testing::write_file;

const char* kExamples[] = {"deploy/cluster-spark9.yaml", "deploy/cluster-mixed-4xtp2-1.yaml"};

// Plans an example cluster into dir, with the systemd units pointing at the binary built here (verify checks
// that ExecStart= is executable).
Plan plan_example(const std::string& cluster_file, const std::string& dir) {
  ClusterSpec c = ClusterSpec::load(cluster_file);
  c.install.binary = MOESERVE_BINARY;
  Plan p = make_plan(c);
  write_plan(p, dir);
  return p;
}

std::string require_tool(const std::string& name, const std::string& package) {
  std::string path = find_tool(name);
  if (path.empty())
    ADD_FAILURE() << name << " is missing: install the Debian package '" << package
                  << "' (scripts/install-deps.sh does)";
  return path;
}

TEST(PlanTools, PromtoolAcceptsConfigAndRules) {
  std::string promtool = require_tool("promtool", "prometheus");
  if (promtool.empty()) return;
  for (const char* example : kExamples) {
    TempDir dir;
    plan_example(example, dir.path());
    auto config = run_command(promtool + " check config " + dir / "monitoring/prometheus.yml");
    EXPECT_EQ(config.status, 0) << example << "\n" << config.output;
    EXPECT_NE(config.output.find("SUCCESS: 1 rule files found"), std::string::npos) << config.output;
    auto rules = run_command(promtool + " check rules " + dir / "monitoring/alerts.yml");
    EXPECT_EQ(rules.status, 0) << example << "\n" << rules.output;
    EXPECT_NE(rules.output.find("SUCCESS: 9 rules found"), std::string::npos) << rules.output;
  }
}

// The alerts fire on the situations they are named after (promtool evaluates them over synthetic series).
TEST(PlanTools, AlertsFireOnSyntheticSeries) {
  std::string promtool = require_tool("promtool", "prometheus");
  if (promtool.empty()) return;
  TempDir dir;
  plan_example("deploy/cluster-spark9.yaml", dir.path());
  write_file(dir / "monitoring/alerts_test.yml", R"(rule_files:
  - alerts.yml
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="moeserve-nodes", instance="10.0.0.11:30000", node="spark-01"}'
        values: '1 1 0 0 0 0 0 0 0 0'
      - series: 'up{job="moeserve-nodes", instance="10.0.0.12:30000", node="spark-02"}'
        values: '1 1 1 1 1 1 1 1 1 1'
      - series: 'moeserve:kv_cache_usage_perc{instance="10.0.0.12:30000", node="spark-02"}'
        values: '0.5 0.99 0.99 0.99 0.99 0.99 0.99 0.99 0.99 0.99'
      - series: 'moeserve:kv_cache_usage_perc{instance="10.0.0.13:30000", node="spark-03"}'
        values: '0.5 0.6 0.6 0.6 0.6 0.6 0.6 0.6 0.6 0.6'
      - series: 'moeserve:memory_used_bytes{instance="10.0.0.13:30000", node="spark-03"}'
        values: '100e9 100e9 100e9 100e9 100e9 100e9 100e9 100e9 100e9 100e9'
      - series: 'moeserve:memory_total_bytes{instance="10.0.0.13:30000", node="spark-03"}'
        values: '128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9'
      - series: 'moeserve:memory_used_bytes{instance="10.0.0.14:30000", node="spark-04"}'
        values: '120e9 120e9 120e9 120e9 120e9 120e9 120e9 120e9 120e9 120e9'
      - series: 'moeserve:memory_total_bytes{instance="10.0.0.14:30000", node="spark-04"}'
        values: '128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9 128e9'
      - series: 'moeserve_router_responses_total{job="moeserve-router", instance="10.0.0.10:8000", code="200"}'
        values: '0+60x10'
      - series: 'moeserve_router_responses_total{job="moeserve-router", instance="10.0.0.10:8000", code="502"}'
        values: '0+30x10'
      - series: 'moeserve_router_backend_up{instance="10.0.0.10:8000", backend="http://10.0.0.15:30000"}'
        values: '1 1 0 0 0 0 0 0 0 0'
    alert_rule_test:
      - eval_time: 8m
        alertname: MoeserveNodeDown
        exp_alerts:
          - exp_labels: {severity: critical, job: moeserve-nodes, instance: "10.0.0.11:30000", node: spark-01}
            exp_annotations:
              summary: 'moeserve node spark-01 (10.0.0.11:30000) is down'
              description: 'Prometheus cannot scrape 10.0.0.11:30000; the router has stopped sending it traffic. Check `systemctl status moeserve` or the container logs on the node, then `moeserve doctor` there.'
      - eval_time: 8m
        alertname: MoeserveKvCacheExhausted
        exp_alerts:
          - exp_labels: {severity: warning, instance: "10.0.0.12:30000", node: spark-02}
            exp_annotations:
              summary: 'node spark-02: KV cache 99% full'
              description: 'New requests queue until sequences finish; lower max_running_requests or max_model_len, or add nodes.'
      - eval_time: 8m
        alertname: MoeserveMemoryPressure
        exp_alerts:
          - exp_labels: {severity: warning, instance: "10.0.0.14:30000", node: spark-04}
            exp_annotations:
              summary: 'node spark-04 uses 93.75% of its memory'
              description: 'Above the server''s pressure threshold new requests get 503. On unified-memory nodes (DGX Spark) the OS, page cache and other processes share this memory.'
      - eval_time: 8m
        alertname: MoeserveHighErrorRate
        exp_alerts:
          - exp_labels: {severity: warning, instance: "10.0.0.10:8000"}
            exp_annotations:
              summary: '33.33% of requests through 10.0.0.10:8000 fail'
              description: 'Server errors clients got from the router over 5 minutes (its own 502/503 included).'
      - eval_time: 8m
        alertname: MoeserveBackendEjected
        exp_alerts:
          - exp_labels: {severity: warning, instance: "10.0.0.10:8000", backend: "http://10.0.0.15:30000"}
            exp_annotations:
              summary: 'the router took http://10.0.0.15:30000 out of rotation'
              description: 'Failed requests (max_fails), health checks or the circuit breaker ejected this node; it rejoins on its own once healthy.'
      - eval_time: 1m
        alertname: MoeserveNodeDown
        exp_alerts: []
)");
  auto r = run_command(promtool + " test rules " + dir / "monitoring/alerts_test.yml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS"), std::string::npos) << r.output;
}

// nginx -t binds the listen ports, so it runs in a private network namespace where 8000/8001 are free
// whatever else this machine runs (the example routers listen on all addresses).
TEST(PlanTools, NginxAcceptsTheGeneratedConfig) {
  std::string nginx = require_tool("nginx", "nginx");
  if (nginx.empty()) return;
  std::string unshare = require_tool("unshare", "util-linux");
  if (unshare.empty()) return;
  for (const char* example : kExamples) {
    TempDir dir;
    plan_example(example, dir.path());
    std::filesystem::create_directories(dir / "prefix");
    auto r = run_command(unshare + " -n " + nginx + " -t -e stderr -p " + dir / "prefix" + " -c " +
                         dir / "router/nginx.conf");
    EXPECT_EQ(r.status, 0) << example << "\n" << r.output;
    EXPECT_NE(r.output.find("test is successful"), std::string::npos) << r.output;
  }
}

TEST(PlanTools, SystemdAcceptsTheUnits) {
  std::string analyze = require_tool("systemd-analyze", "systemd");
  if (analyze.empty()) return;
  for (const char* example : kExamples) {
    TempDir dir;
    Plan p = plan_example(example, dir.path());
    int units = 0;
    for (const auto& f : p.files) {
      if (!f.path.ends_with(".service")) continue;
      ++units;
      // verify wants the unit name to end in .service and prints warnings (exit 0) for unknown keys or bad
      // values: any output is a failure.
      std::string copy = dir / ("verify-" + std::to_string(units) + ".service");
      write_file(copy, f.content);
      auto r = run_command(analyze + " verify " + copy);
      EXPECT_EQ(r.status, 0) << f.path << "\n" << r.output;
      EXPECT_EQ(r.output, "") << f.path;
    }
    EXPECT_GE(units, 10) << example;
  }
}

TEST(PlanTools, GeneratedScriptsAreValidBash) {
  for (const char* example : kExamples) {
    TempDir dir;
    Plan p = plan_example(example, dir.path());
    for (const auto& f : p.files) {
      if (!f.path.ends_with(".sh")) continue;
      EXPECT_TRUE(f.executable) << f.path;
      auto r = run_command("bash -n " + dir / f.path);
      EXPECT_EQ(r.status, 0) << f.path << "\n" << r.output;
    }
  }
}

TEST(PlanTools, DashboardHasTheReferencePanels) {
  Plan p = make_plan(ClusterSpec::load("deploy/cluster-spark9.yaml"));
  nlohmann::json d;
  for (const auto& f : p.files)
    if (f.path == "monitoring/grafana-dashboard.json") d = nlohmann::json::parse(f.content);
  ASSERT_TRUE(d.is_object());
  std::set<std::string> titles;
  std::set<int> ids;
  std::set<std::string> used;
  for (const auto& panel : d["panels"]) {
    titles.insert(panel["title"].get<std::string>());
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << "duplicate panel id";
    if (panel["type"] == "row") continue;
    ASSERT_FALSE(panel["targets"].empty()) << panel["title"];
    for (const auto& t : panel["targets"]) {
      auto names = metrics_in(t["expr"].get<std::string>());
      EXPECT_FALSE(names.empty()) << t["expr"];
      used.insert(names.begin(), names.end());
    }
  }
  for (const char* want : {"Memory pressure per node", "Time to first token per node (p50 / p99)",
                           "Generation throughput per node", "Load-balancing efficiency", "Error rate",
                           "End-to-end latency (p50 / p99)", "Completion rate"})
    EXPECT_TRUE(titles.count(want)) << want;
  // Every series the dashboard and alerts read is one the servers and router export (metric_names.h; the
  // live check against /metrics is in the cluster tests).
  const std::set<std::string> exported = {metric::kRequestsRunning,
                                          metric::kRequestsWaiting,
                                          metric::kRequestSuccess,
                                          metric::kRequestErrors,
                                          metric::kPromptTokens,
                                          metric::kGenerationTokens,
                                          metric::kTtft,
                                          metric::kItl,
                                          metric::kE2e,
                                          metric::kQueueTime,
                                          metric::kPrefixQueries,
                                          metric::kPrefixHits,
                                          metric::kKvUsage,
                                          metric::kMemoryUsed,
                                          metric::kMemoryTotal,
                                          metric::kThrottled,
                                          metric::kRouterResponses,
                                          metric::kRouterBackendRequests,
                                          metric::kRouterInFlight,
                                          metric::kRouterBackendUp,
                                          metric::kRouterDuration,
                                          metric::kRouterTtfb,
                                          metric::kRouterImbalance};
  for (const auto& name : used) EXPECT_TRUE(exported.count(name)) << name;
  std::string rules;
  for (const auto& f : p.files)
    if (f.path == "monitoring/alerts.yml") rules = f.content;
  for (const auto& name : metrics_in(rules)) EXPECT_TRUE(exported.count(name)) << name;
}

// ---- nginx live in front of a streaming backend
// ------------------------------------------------------------

TEST(PlanTools, NginxProxiesAndStreamsUnbuffered) {
  std::string nginx = require_tool("nginx", "nginx");
  if (nginx.empty()) return;
  // A backend that streams two SSE chunks and holds the second back until the client has received the first:
  // if nginx buffered the response, the first chunk would never arrive.
  testing::Gate second_chunk;
  testing::FakeBackend backend([&](const testing::HttpRequest&, testing::BackendConnection& c) {
    c.start_stream();
    c.chunk("data: first\n\n");
    second_chunk.wait(30'000);
    c.chunk("data: second\n\n");
    c.chunk("data: [DONE]\n\n");
    c.end_stream();
  });
  int router_port = testing::free_port();
  TempDir dir;
  std::string yaml = fmt::format(R"(
cluster: loopback
nodes: [{{name: local, host: 127.0.0.1, gpu: cpu, arch: x86_64, memory: 16GB}}]
models:
  - {{name: tiny, path: tests/fixtures/models/tiny-moe, max_model_len: 2048, max_running_requests: 4,
     port: {}, nodes: [local]}}
router: {{host: 127.0.0.1, listen: 127.0.0.1, port: {}}}
monitoring: {{prometheus_port: {}, grafana_port: {}}}
)",
                                 backend.port(), router_port, testing::free_port(), testing::free_port());
  Plan p = make_plan(ClusterSpec::parse(parse_structured_text(yaml, "loopback.yaml"), "loopback.yaml", "."));
  write_plan(p, dir.path());
  std::filesystem::create_directories(dir / "prefix");
  // Runs in the foreground; SIGTERM (fast shutdown) makes the master stop its workers.
  testing::ChildProcess proxy(
      {nginx, "-p", dir / "prefix", "-c", dir / "router/nginx.conf", "-e", "stderr", "-g", "daemon off;"},
      {.log_path = dir / "nginx.log", .stop_signal = SIGTERM});

  ASSERT_TRUE(peers::wait_listening(router_port, 20'000))
      << "nginx did not start listening; its log:\n"
      << read_file(dir / "prefix/error.log") << proxy.output();
  testing::HttpClient client(router_port);
  client.send("POST", "/v1/chat/completions",
              R"({"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]})",
              {{"Connection", "close"}});
  testing::HttpResponse response;
  ASSERT_TRUE(client.read_head(response, 30'000));
  EXPECT_TRUE(client.read_until(response, "data: first", 30'000))
      << "the first chunk did not come through before the backend finished: nginx buffers\n"
      << response.body;
  EXPECT_EQ(response.body.find("data: second"), std::string::npos);
  second_chunk.open();
  EXPECT_TRUE(client.read_until(response, "data: [DONE]", 30'000)) << response.body;
  client.close();
  EXPECT_EQ(response.status, 200) << response.body;
  // The upstream request is HTTP/1.1 with the client's Connection header cleared (keep-alive upstreams).
  const auto upstream = backend.requests();
  ASSERT_FALSE(upstream.empty());
  EXPECT_EQ(upstream[0].method + " " + upstream[0].target + " " + upstream[0].version,
            "POST /v1/chat/completions HTTP/1.1");
  EXPECT_NE(upstream[0].header("connection"), "close");
}

}  // namespace
}  // namespace moeserve::deploy
