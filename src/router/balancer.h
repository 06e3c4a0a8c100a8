#pragma once
// The routing state of `moeserve route`: the backends, their health (nginx's passive max_fails/fail_timeout,
// active health checks, a circuit breaker, 429 Retry-After), the balancing policies and the counters behind
// /metrics and /backends. Thread-safe (one mutex: decisions are short). No I/O here, so it is tested
// directly.

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/config.h"
#include "router/prefix_tree.h"

namespace moeserve {
class MetricsRegistry;
}

namespace moeserve::router {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// How one attempt on a backend ended, as nginx's peer "free" state: a failure counts towards max_fails and
// the circuit breaker, a success clears them, a neutral end (429, client gone) changes neither. `died` is a
// failure where the backend closed or reset the connection after it had the request: it may have crashed on
// that request, so it is taken out at once rather than after max_fails.
enum class Outcome { success, failure, neutral, died };

// Why the policy chose the backend it chose; exported as routing decision counters.
enum class Decision { policy, affinity, cache_hit, cache_miss, imbalanced };
std::string_view decision_name(Decision decision);

// Fixed-bucket latency histogram in seconds (Prometheus semantics: cumulative on render).
struct Histogram {
  static constexpr std::array<double, 17> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,    5,     10,   30,    60,   120, 300};
  std::array<uint64_t, kBounds.size() + 1> counts{};
  double sum = 0;
  uint64_t count = 0;
  void observe(double seconds);
};

struct Backend {
  enum class Breaker { closed, open, half_open };

  int id = 0;
  std::string url;
  BackendAddress address;
  int weight = 1;
  int max_fails = 3;
  Duration fail_timeout{30000};
  std::vector<std::string> models;  // configured, or learnt from the backend's /v1/models
  bool models_configured = false;
  std::vector<std::pair<std::string, std::string>> model_cards;  // id, JSON object from /v1/models

  // nginx round-robin peer state (ngx_http_upstream_rr_peer_t).
  int effective_weight = 1;
  int current_weight = 0;
  int fails = 0;
  TimePoint accessed{};
  TimePoint checked{};
  int in_flight = 0;  // nginx "conns"

  Breaker breaker = Breaker::closed;
  int breaker_failures = 0;    // consecutive
  int breaker_successes = 0;   // consecutive, while half-open
  bool breaker_trial = false;  // a half-open trial request is in flight
  TimePoint breaker_opened{};

  bool healthy = true;  // active health checks
  int health_fail_streak = 0;
  int health_ok_streak = 0;
  TimePoint busy_until{};  // a 429 with Retry-After
  bool draining = false;
  bool removed = false;

  // Load a moeserve/vLLM/SGLang node reports in its /metrics (running + waiting); -1 when unknown.
  double reported_load = -1;
  double reported_kv_usage = -1;

  PrefixTree tree;

  // Counters for /metrics.
  std::map<std::string, uint64_t> responses;  // by status code, or "error"
  std::map<std::string, uint64_t> failures;   // by reason
  std::map<std::string, uint64_t> ejections;  // by mechanism
  Histogram ttfb;
  Histogram duration;

  explicit Backend(size_t max_tree_symbols) : tree(max_tree_symbols) {}
};

// What the router knows about a request when it routes it.
struct RouteRequest {
  std::string model;          // "" when the body names none
  std::vector<uint32_t> key;  // cache_aware: bytes of the rendered text or token ids; empty when none
  std::string session;        // affinity key (X-Session-ID or "user"); "" when none
  // The Responses API's previous_response_id, or the id in a /v1/responses/{id} path: the backend that
  // produced that response holds it, and no other; "" when none.
  std::string previous_response;
};

// Key -> backend id for the most recent keys, at most `capacity` (the oldest is dropped first): sessions,
// and response ids learned from the answers passing through.
class RecentRoutes {
 public:
  explicit RecentRoutes(size_t capacity) : capacity_(capacity) {}
  std::optional<int> find(const std::string& key) const;
  void set(const std::string& key, int backend);
  size_t size() const { return map_.size(); }

 private:
  size_t capacity_;
  std::unordered_map<std::string, int> map_;
  std::vector<std::string> order_;  // a ring once full: order_[head_] is the oldest
  size_t head_ = 0;
};

struct Selection {
  std::shared_ptr<Backend> backend;
  Decision decision = Decision::policy;
  bool trial = false;  // the circuit breaker's half-open trial
};

class Balancer {
 public:
  explicit Balancer(const RouterConfig& config, std::function<TimePoint()> now = Clock::now,
                    uint64_t seed = 0);

  // A backend for the request, none of `tried` (ids of backends already attempted for it). Counts it in
  // flight. nullopt when no backend can take it; then, as nginx does, every failure count is cleared so the
  // next request tries them all again ("quick recovery").
  std::optional<Selection> pick(const RouteRequest& request, std::span<const int> tried = {});
  // Whether pick() would find a backend (used to decide if a retryable answer is worth retrying elsewhere).
  bool can_route(const RouteRequest& request, std::span<const int> tried);
  // Ends an attempt started by pick(): passive health, circuit breaker, in-flight count. A backend that
  // `died` is out until active health checks pass health_successes times; with health checks off, for
  // fail_timeout as a max_fails ejection (so never with max_fails 0, nor as the only backend: nginx's rules).
  void finish(const Selection& selection, Outcome outcome, std::string_view reason = "");
  // A backend answered a Responses API request with this response id: a request that continues it
  // (previous_response_id) goes to that backend while it is available.
  void learn_response(const std::string& response_id, int backend_id);
  // Records the response a backend gave (status code, or "error") and its latencies (negative: not measured).
  void record_response(Backend& backend, std::string_view status, double ttfb_seconds, double total_seconds);
  // The backend answered 429: keep new requests away for `wait` (capped by max_retry_after).
  void retry_after(Backend& backend, Duration wait);
  // One active health check's result.
  void health_result(Backend& backend, bool ok);
  // What GET /v1/models on the backend listed: ids, and each model object as JSON text (merged in
  // /v1/models); ids[i] is cards[i]'s id.
  void set_models(Backend& backend, std::vector<std::string> ids, std::vector<std::string> cards);
  void set_reported_load(Backend& backend, double load, double kv_usage);

  // Router-level events for /metrics.
  void count_client_response(int status);
  void count_retry(std::string_view reason);

  // Admin (run time): returns the backend, or nullptr when the URL is unknown/already present.
  std::shared_ptr<Backend> add(const BackendSpec& spec);
  bool drain(const std::string& url);
  bool remove(const std::string& url);

  std::vector<std::shared_ptr<Backend>> backends() const;
  std::vector<std::string> model_cards() const;  // every backend's model objects, one per model id
  bool serves_several_models() const;            // then requests must be read to route by their "model"
  bool available(const Backend& backend);        // could pick() choose it now (ignoring models and tried)?
  int in_flight() const;

  nlohmann::json describe() const;                       // GET /backends
  void export_metrics(MetricsRegistry& registry) const;  // GET /metrics: the balancer's series, in order

  const RouterConfig& config() const { return config_; }

 private:
  bool available_locked(Backend& b, TimePoint now);
  std::vector<Backend*> candidates_locked(const RouteRequest& request, std::span<const int> tried,
                                          TimePoint now);
  bool ejected_by_fails(const Backend& b, TimePoint now) const;
  std::string state_locked(const Backend& b, TimePoint now) const;
  Backend* pick_least_conn(const std::vector<Backend*>& candidates);
  Backend* pick_round_robin(const std::vector<Backend*>& candidates);
  Backend* pick_random(const std::vector<Backend*>& candidates);
  Backend* pick_power_of_two(const std::vector<Backend*>& candidates);
  Backend* pick_cache_aware(const std::vector<Backend*>& candidates, const RouteRequest& request,
                            Decision& decision);
  Backend* least_loaded(const std::vector<Backend*>& candidates);
  double load(const Backend& b) const;
  void eject_count(Backend& b, std::string_view mechanism);
  std::shared_ptr<Backend> make_backend(const BackendSpec& spec);

  RouterConfig config_;
  std::function<TimePoint()> now_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Backend>> backends_;
  int next_id_ = 0;
  std::mt19937_64 rng_;
  uint64_t tie_breaker_ = 0;

  // Session affinity: session key -> backend id; response id -> the backend that holds the response.
  RecentRoutes sessions_{100'000};
  RecentRoutes responses_{100'000};

  std::map<std::string, uint64_t> decisions_;
  std::map<int, uint64_t> client_responses_;
  std::map<std::string, uint64_t> retries_;
  uint64_t cache_queried_symbols_ = 0;
  uint64_t cache_matched_symbols_ = 0;
  uint64_t no_backend_ = 0;
};

}  // namespace moeserve::router
