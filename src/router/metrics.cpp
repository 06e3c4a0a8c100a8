// GET /metrics of the router: the balancer's counters, gauges and histograms copied into a MetricsRegistry
// (the server's Prometheus exposition, in common/) at each scrape. A registry per scrape keeps the balancer
// the one owner of its state: a removed backend's series go with it, as its counters do. Checked by
// `promtool check metrics` in tests/router.
#include "common/metrics.h"

#include "router/balancer.h"

namespace moeserve::router {

namespace {

using Type = MetricsRegistry::Type;

const std::vector<double> kLatencyBounds(Histogram::kBounds.begin(), Histogram::kBounds.end());

void copy_histogram(MetricsRegistry& registry, const std::string& name, const std::string& help,
                    const Labels& labels, const Histogram& h) {
  registry.histogram(name, help, kLatencyBounds, labels).add(h.counts, h.sum);
}

}  // namespace

void Balancer::export_metrics(MetricsRegistry& registry) const {
  std::lock_guard lock(mu_);
  TimePoint now = now_();
  auto backend = [](const Backend& b) { return Labels{{"backend", b.url}}; };
  auto with = [](const Backend& b, const std::string& key, const std::string& value) {
    return Labels{{"backend", b.url}, {key, value}};
  };

  std::string name = "moeserve_router_backend_requests_total";
  std::string help =
      "Responses received from each backend by HTTP status (\"error\": none, the connection failed).";
  registry.declare(name, help, Type::kCounter);
  for (const auto& b : backends_)
    for (const auto& [status, n] : b->responses)
      registry.counter(name, help, with(*b, "status", status)).inc(n);

  name = "moeserve_router_backend_failures_total";
  help = "Failed attempts on each backend (they count towards max_fails and the circuit breaker), by reason.";
  registry.declare(name, help, Type::kCounter);
  for (const auto& b : backends_)
    for (const auto& [reason, n] : b->failures)
      registry.counter(name, help, with(*b, "reason", reason)).inc(n);

  name = "moeserve_router_backend_ejections_total";
  help =
      "Times each backend was taken out of rotation, by mechanism (max_fails, circuit_breaker, health_check, "
      "died: it dropped a request it had been sent).";
  registry.declare(name, help, Type::kCounter);
  for (const auto& b : backends_)
    for (const auto& [mechanism, n] : b->ejections)
      registry.counter(name, help, with(*b, "mechanism", mechanism)).inc(n);

  name = "moeserve_router_backend_in_flight";
  help = "Requests in flight on each backend.";
  registry.declare(name, help, Type::kGauge);
  for (const auto& b : backends_) registry.gauge(name, help, backend(*b)).set(b->in_flight);

  name = "moeserve_router_backend_up";
  help = "1 when the backend is in rotation (healthy), else 0.";
  registry.declare(name, help, Type::kGauge);
  for (const auto& b : backends_)
    registry.gauge(name, help, backend(*b)).set(state_locked(*b, now) == "healthy" ? 1 : 0);

  name = "moeserve_router_backend_prefix_tree_symbols";
  help = "Symbols (text bytes or token ids) held in each backend's cache_aware prefix tree.";
  registry.declare(name, help, Type::kGauge);
  for (const auto& b : backends_) registry.gauge(name, help, backend(*b)).set(b->tree.size());

  name = "moeserve_router_backend_time_to_first_byte_seconds";
  help = "Time from sending a request to a backend to its response head.";
  registry.declare(name, help, Type::kHistogram, kLatencyBounds);
  for (const auto& b : backends_) copy_histogram(registry, name, help, backend(*b), b->ttfb);

  name = "moeserve_router_backend_request_duration_seconds";
  help = "Time from sending a request to a backend to the end of its response.";
  registry.declare(name, help, Type::kHistogram, kLatencyBounds);
  for (const auto& b : backends_) copy_histogram(registry, name, help, backend(*b), b->duration);

  name = "moeserve_router_routing_decisions_total";
  help = "Routing decisions by policy and outcome (policy, affinity, cache_hit, cache_miss, imbalanced).";
  registry.declare(name, help, Type::kCounter);
  uint64_t hits = 0, misses = 0;
  for (const auto& [key, n] : decisions_) {  // "policy/decision"
    size_t slash = key.find('/');
    registry.counter(name, help, {{"policy", key.substr(0, slash)}, {"decision", key.substr(slash + 1)}})
        .inc(n);
    if (key.ends_with("/cache_hit")) hits += n;
    if (key.ends_with("/cache_miss")) misses += n;
  }

  registry
      .gauge("moeserve_router_cache_aware_hit_ratio",
             "cache_aware decisions that found a prefix above the threshold, over all prefix lookups.")
      .set(hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0);
  registry
      .counter("moeserve_router_cache_aware_queried_symbols_total",
               "Symbols of requests looked up in the prefix trees.")
      .inc(cache_queried_symbols_);
  registry
      .counter("moeserve_router_cache_aware_matched_symbols_total",
               "Symbols of those requests found in the chosen backend's prefix tree.")
      .inc(cache_matched_symbols_);

  int total = 0, max_in_flight = 0, live = 0;
  for (const auto& b : backends_) {
    if (b->removed || b->draining) continue;
    total += b->in_flight;
    max_in_flight = std::max(max_in_flight, b->in_flight);
    ++live;
  }
  double mean = live ? static_cast<double>(total) / live : 0.0;
  registry
      .gauge("moeserve_router_load_imbalance",
             "Max over mean of the backends' in-flight requests (1 is perfectly balanced; 1 when idle).")
      .set(mean > 0 ? max_in_flight / mean : 1.0);
  registry.gauge("moeserve_router_requests_in_flight", "Requests being proxied now.").set(total);

  name = "moeserve_router_responses_total";
  help = "Responses the router sent to clients, by HTTP status (its own errors included).";
  registry.declare(name, help, Type::kCounter);
  for (const auto& [code, n] : client_responses_)
    registry.counter(name, help, {{"code", std::to_string(code)}}).inc(n);

  name = "moeserve_router_retries_total";
  help = "Requests sent again to another backend before any response byte reached the client, by reason.";
  registry.declare(name, help, Type::kCounter);
  for (const auto& [reason, n] : retries_) registry.counter(name, help, {{"reason", reason}}).inc(n);

  registry.counter("moeserve_router_no_backend_total", "Requests for which no backend was available.")
      .inc(no_backend_);
}

}  // namespace moeserve::router
