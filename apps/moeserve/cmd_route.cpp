// moeserve route: the cluster's front door (docs/router.md).
#include <CLI/CLI.hpp>
#include <memory>

#include "command.h"
#include "common/error.h"
#include "router/config.h"
#include "router/router.h"

namespace {

using namespace moeserve;
using namespace moeserve::router;

struct RouteFlags {
  std::string config_file;
  std::vector<std::string> backends;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string policy = "least_conn";
  int workers = 0;
  int max_fails = 3;
  std::string fail_timeout = "30s";
  int keepalive = 32;
  std::string keepalive_timeout = "300s";
  std::string connect_timeout = "10s";
  std::string read_timeout = "300s";
  std::string send_timeout = "300s";
  std::string client_header_timeout = "60s";
  int64_t max_body_size = int64_t{64} << 20;
  int64_t max_body_memory = int64_t{512} << 20;
  int max_connections = 4096;
  int retries = 3;
  std::string health_interval = "10s";
  std::string health_timeout = "5s";
  std::string health_path = "/health";
  double cache_threshold = 0.3;
  int balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  int64_t max_tree_size = int64_t{1} << 23;
  std::string tokenizer;
  bool session_affinity = false;
  std::string api_key;
  std::string admin_key;
  std::string shutdown_timeout = "30s";
};

std::function<int()> setup(CLI::App& app) {
  auto flags = std::make_shared<RouteFlags>();
  auto& f = *flags;
  app.add_option("--config", f.config_file, "cluster file (YAML or JSON) with router settings and backends");
  app.add_option("--backend", f.backends, "backend URL, e.g. http://10.0.0.1:30000 (repeatable)");
  app.add_option("--host", f.host, "listen address")->capture_default_str();
  app.add_option("--port", f.port, "listen port")->capture_default_str();
  app.add_option("--policy", f.policy, "least_conn|round_robin|power_of_two|cache_aware|random")
      ->capture_default_str();
  app.add_option("--workers", f.workers, "I/O threads (0 = one per core)")->capture_default_str();
  app.add_option("--max-fails", f.max_fails,
                 "failures within --fail-timeout that eject a backend (0 = never)")
      ->capture_default_str();
  app.add_option("--fail-timeout", f.fail_timeout, "nginx fail_timeout: failure window and ejection time")
      ->capture_default_str();
  app.add_option("--keepalive", f.keepalive, "idle upstream connections kept per backend and worker")
      ->capture_default_str();
  app.add_option("--keepalive-timeout", f.keepalive_timeout, "idle upstream connections close after this")
      ->capture_default_str();
  app.add_option("--connect-timeout", f.connect_timeout, "connecting to a backend")->capture_default_str();
  app.add_option("--read-timeout", f.read_timeout, "between two reads from a backend (or the client)")
      ->capture_default_str();
  app.add_option("--send-timeout", f.send_timeout, "between two writes to a backend or the client")
      ->capture_default_str();
  app.add_option("--client-header-timeout", f.client_header_timeout,
                 "reading a request; idle client keep-alive")
      ->capture_default_str();
  app.add_option("--max-body-size", f.max_body_size, "largest request body in bytes (413 above)")
      ->capture_default_str();
  app.add_option("--max-body-memory", f.max_body_memory,
                 "request body bytes held at once over all connections (503 above)")
      ->capture_default_str();
  app.add_option("--max-connections", f.max_connections, "client connections open at once (503 above)")
      ->capture_default_str();
  app.add_option("--retries", f.retries, "attempts on other backends before any response byte was sent")
      ->capture_default_str();
  app.add_option("--health-interval", f.health_interval, "active health checks of each backend (0 = off)")
      ->capture_default_str();
  app.add_option("--health-timeout", f.health_timeout, "one health check")->capture_default_str();
  app.add_option("--health-path", f.health_path, "path checked on each backend")->capture_default_str();
  app.add_option("--cache-threshold", f.cache_threshold,
                 "cache_aware: matched fraction that routes by prefix")
      ->capture_default_str();
  app.add_option("--balance-abs-threshold", f.balance_abs_threshold, "cache_aware: imbalance, absolute")
      ->capture_default_str();
  app.add_option("--balance-rel-threshold", f.balance_rel_threshold, "cache_aware: imbalance, relative")
      ->capture_default_str();
  app.add_option("--max-tree-size", f.max_tree_size, "cache_aware: symbols kept per backend (LRU beyond)")
      ->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer,
                 "cache_aware: tokenizer.json, to match token ids instead of text");
  app.add_flag("--session-affinity", f.session_affinity, "pin X-Session-ID / \"user\" to a backend");
  // From the environment too, so that a key need not show in `ps` or a unit file; the flag wins.
  app.add_option("--api-key", f.api_key,
                 "require 'Authorization: Bearer KEY' on all but /health, /metrics, /version, GET /backends")
      ->envname("MOESERVE_API_KEY");
  app.add_option("--admin-key", f.admin_key, "key for /backends/add|drain|remove (default: --api-key)")
      ->envname("MOESERVE_ADMIN_KEY");
  app.add_option("--shutdown-timeout", f.shutdown_timeout, "SIGTERM: time given to requests in flight")
      ->capture_default_str();

  return [flags, &app]() -> int {
    const RouteFlags& f = *flags;
    RouterConfig config = f.config_file.empty() ? RouterConfig{} : load_config_file(f.config_file);
    auto given = [&](const char* name) { return app.count(name) > 0; };
    // Flags given on the command line (or the keys' environment variables) override the cluster file.
    if (given("--host")) config.host = f.host;
    if (given("--port")) {
      check(f.port >= 0 && f.port <= 65535, "--port must be 0..65535");
      config.port = static_cast<uint16_t>(f.port);
    }
    if (given("--policy")) config.policy = parse_policy(f.policy);
    if (given("--workers")) config.workers = f.workers;
    if (given("--max-fails")) config.max_fails = f.max_fails;
    if (given("--fail-timeout")) config.fail_timeout = parse_duration(f.fail_timeout);
    if (given("--keepalive")) config.keepalive = f.keepalive;
    if (given("--keepalive-timeout")) config.keepalive_timeout = parse_duration(f.keepalive_timeout);
    if (given("--connect-timeout")) config.connect_timeout = parse_duration(f.connect_timeout);
    if (given("--read-timeout")) config.read_timeout = parse_duration(f.read_timeout);
    if (given("--send-timeout")) config.send_timeout = parse_duration(f.send_timeout);
    if (given("--client-header-timeout"))
      config.client_header_timeout = parse_duration(f.client_header_timeout);
    if (given("--max-body-size")) {
      check(f.max_body_size > 0, "--max-body-size must be positive");
      config.max_body_bytes = static_cast<size_t>(f.max_body_size);
    }
    if (given("--max-body-memory")) {
      check(f.max_body_memory > 0, "--max-body-memory must be positive");
      config.max_body_memory = static_cast<size_t>(f.max_body_memory);
    }
    if (given("--max-connections")) config.max_connections = f.max_connections;
    if (given("--retries")) config.retries = f.retries;
    if (given("--health-interval")) config.health_interval = parse_duration(f.health_interval);
    if (given("--health-timeout")) config.health_timeout = parse_duration(f.health_timeout);
    if (given("--health-path")) config.health_path = f.health_path;
    if (given("--cache-threshold")) config.cache_threshold = f.cache_threshold;
    if (given("--balance-abs-threshold")) config.balance_abs_threshold = f.balance_abs_threshold;
    if (given("--balance-rel-threshold")) config.balance_rel_threshold = f.balance_rel_threshold;
    if (given("--max-tree-size")) {
      check(f.max_tree_size > 0, "--max-tree-size must be positive");
      config.max_tree_symbols = static_cast<size_t>(f.max_tree_size);
    }
    if (given("--tokenizer")) config.tokenizer = f.tokenizer;
    if (given("--session-affinity")) config.session_affinity = f.session_affinity;
    if (given("--api-key")) config.api_key = f.api_key;
    if (given("--admin-key")) config.admin_key = f.admin_key;
    if (given("--shutdown-timeout")) config.shutdown_timeout = parse_duration(f.shutdown_timeout);
    for (const auto& url : f.backends) {
      BackendSpec spec;
      spec.url = url;
      config.backends.push_back(spec);
    }
    validate(config);
    return run_router(config);
  };
}

moeserve::app::Registration reg{
    {"route",
     "Route OpenAI requests over many servers (least_conn, cache_aware, ...) with health and failover", 15,
     setup}};

}  // namespace
