#pragma once
// What `moeserve route` is told: listen address, backends, policy and the nginx-style tuning of the reference
// deployment. Built from flags or from a cluster file (YAML or JSON); see docs/router.md for every key.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::router {

using Duration = std::chrono::milliseconds;

enum class Policy { least_conn, round_robin, power_of_two, cache_aware, random };

Policy parse_policy(std::string_view name);  // throws moeserve::Error naming the accepted values
std::string_view policy_name(Policy policy);

// "30s", "300ms", "5m", "1h" or a bare number of seconds (nginx's convention); throws on anything else.
Duration parse_duration(std::string_view text);

// An OpenAI-compatible server the router forwards to: "http://host:port[/prefix]".
struct BackendSpec {
  std::string url;
  int weight = 1;
  int max_fails = -1;               // -1: the router-wide value
  Duration fail_timeout{-1};        // negative: the router-wide value
  std::vector<std::string> models;  // served models when known up front; otherwise learnt from /v1/models
};

// host, port and path prefix of a backend URL; throws on anything but plain http.
struct BackendAddress {
  std::string host;
  uint16_t port = 80;
  std::string prefix;  // "" or "/something" prepended to every forwarded target
  std::string host_header;
};
BackendAddress parse_backend_url(std::string_view url);

struct RouterConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 8000;
  std::vector<BackendSpec> backends;
  Policy policy = Policy::least_conn;
  int workers = 0;  // I/O threads; 0 = one per core

  // Passive failure detection, as nginx's `server ... max_fails=3 fail_timeout=30s`.
  int max_fails = 3;
  Duration fail_timeout = std::chrono::seconds(30);
  // Upstream connections: idle keep-alive connections kept per backend and I/O thread (nginx `keepalive 32`).
  int keepalive = 32;
  Duration keepalive_timeout = std::chrono::seconds(300);
  Duration connect_timeout = std::chrono::seconds(10);
  Duration read_timeout = std::chrono::seconds(300);  // between two reads from a backend or the client
  Duration send_timeout = std::chrono::seconds(300);  // between two writes to a backend or the client
  Duration client_header_timeout = std::chrono::seconds(60);  // request head and body, idle keep-alive
  // Client connections and the request bodies they buffer (503 with Retry-After beyond either limit). A
  // connection holds one body at a time, up to max_body_bytes; all of them together hold at most
  // max_body_memory, counted from the Content-Length before the body is read and released once a backend's
  // answer has begun.
  size_t max_body_bytes = size_t{64} << 20;
  size_t max_body_memory = size_t{512} << 20;
  int max_connections = 4096;
  int retries = 3;  // further attempts on other backends before any response byte reached the client
  Duration max_retry_after = std::chrono::seconds(60);  // cap on a backend's 429 Retry-After

  // Active health checks.
  Duration health_interval = std::chrono::seconds(10);
  Duration health_timeout = std::chrono::seconds(5);
  std::string health_path = "/health";
  int health_failures = 3;   // consecutive failed checks that take a backend out
  int health_successes = 2;  // consecutive passed checks that bring it back

  // Circuit breaker: opens after this many consecutive failures, half-opens after cb_timeout (one trial
  // request at a time), closes after cb_successes consecutive successes.
  int cb_failures = 5;
  int cb_successes = 2;
  Duration cb_timeout = std::chrono::seconds(30);

  // cache_aware (defaults from SGLang's router CLI).
  double cache_threshold = 0.3;
  int balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  size_t max_tree_symbols = size_t{1} << 23;  // per backend; bytes of text or token ids
  std::string tokenizer;                      // tokenizer.json: match token ids instead of text

  bool session_affinity = false;  // X-Session-ID header or the body's "user" field pins a backend

  // Clients must send "Authorization: Bearer KEY" (forwarded unchanged) everywhere but /health, /v1/health,
  // /metrics, /version and GET /backends; decided from the request head, before any body is read.
  std::string api_key;
  std::string admin_key;                                 // for the /backends admin calls; defaults to api_key
  Duration shutdown_timeout = std::chrono::seconds(30);  // SIGTERM: how long in-flight requests may finish
};

// Reads a cluster file: YAML (.yaml/.yml) or JSON. Keys are the flag names (with '-' or '_'), either at the
// top level or under "router:"; "backends:" is a list of URLs or of {url, weight, max_fails, fail_timeout,
// models}.
RouterConfig load_config_file(const std::string& path);
// The same from text already read (format "yaml" or "json"); `origin` names it in errors.
RouterConfig parse_config(std::string_view text, std::string_view format, std::string_view origin);

// Throws moeserve::Error when the configuration cannot work (no backends, bad URL, zero thresholds...).
void validate(const RouterConfig& config);

}  // namespace moeserve::router
