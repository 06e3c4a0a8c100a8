// GET /metrics of the router: Prometheus text exposition 0.0.4, written by hand (a few counters and
// histograms need no library), checked by `promtool check metrics` in tests/router.
#include <fmt/format.h>

#include "router/balancer.h"

namespace moeserve::router {

namespace {

std::string escape_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void histogram(std::string& out, std::string_view name, std::string_view labels, const Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
    cumulative += h.counts[i];
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{},le=\"{}\"}} {}\n", name, labels,
                   Histogram::kBounds[i], cumulative);
  }
  fmt::format_to(std::back_inserter(out), "{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, h.count);
  fmt::format_to(std::back_inserter(out), "{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, h.sum, name,
                 labels, h.count);
}

}  // namespace

std::string Balancer::metrics_text() const {
  std::lock_guard lock(mu_);
  TimePoint now = now_();
  std::string out;
  out.reserve(8192 + backends_.size() * 4096);
  auto label = [](const Backend& b) { return fmt::format("backend=\"{}\"", escape_label(b.url)); };
  auto put = [&](std::string_view line) { out += line; };

  header(out, "moeserve_router_backend_requests_total", "counter",
         "Responses received from each backend by HTTP status (\"error\": none, the connection failed).");
  for (const auto& b : backends_)
    for (const auto& [status, n] : b->responses)
      put(fmt::format("moeserve_router_backend_requests_total{{{},status=\"{}\"}} {}\n", label(*b), status,
                      n));

  header(
      out, "moeserve_router_backend_failures_total", "counter",
      "Failed attempts on each backend (they count towards max_fails and the circuit breaker), by reason.");
  for (const auto& b : backends_)
    for (const auto& [reason, n] : b->failures)
      put(fmt::format("moeserve_router_backend_failures_total{{{},reason=\"{}\"}} {}\n", label(*b),
                      escape_label(reason), n));

  header(out, "moeserve_router_backend_ejections_total", "counter",
         "Times each backend was taken out of rotation, by mechanism (max_fails, circuit_breaker, "
         "health_check, died: it dropped a request it had been sent).");
  for (const auto& b : backends_)
    for (const auto& [mechanism, n] : b->ejections)
      put(fmt::format("moeserve_router_backend_ejections_total{{{},mechanism=\"{}\"}} {}\n", label(*b),
                      mechanism, n));

  header(out, "moeserve_router_backend_in_flight", "gauge", "Requests in flight on each backend.");
  for (const auto& b : backends_)
    put(fmt::format("moeserve_router_backend_in_flight{{{}}} {}\n", label(*b), b->in_flight));

  header(out, "moeserve_router_backend_up", "gauge", "1 when the backend is in rotation (healthy), else 0.");
  for (const auto& b : backends_)
    put(fmt::format("moeserve_router_backend_up{{{}}} {}\n", label(*b),
                    state_locked(*b, now) == "healthy" ? 1 : 0));

  header(out, "moeserve_router_backend_prefix_tree_symbols", "gauge",
         "Symbols (text bytes or token ids) held in each backend's cache_aware prefix tree.");
  for (const auto& b : backends_)
    put(fmt::format("moeserve_router_backend_prefix_tree_symbols{{{}}} {}\n", label(*b), b->tree.size()));

  header(out, "moeserve_router_backend_time_to_first_byte_seconds", "histogram",
         "Time from sending a request to a backend to its response head.");
  for (const auto& b : backends_)
    histogram(out, "moeserve_router_backend_time_to_first_byte_seconds", label(*b), b->ttfb);

  header(out, "moeserve_router_backend_request_duration_seconds", "histogram",
         "Time from sending a request to a backend to the end of its response.");
  for (const auto& b : backends_)
    histogram(out, "moeserve_router_backend_request_duration_seconds", label(*b), b->duration);

  header(out, "moeserve_router_routing_decisions_total", "counter",
         "Routing decisions by policy and outcome (policy, affinity, cache_hit, cache_miss, imbalanced).");
  for (const auto& [key, n] : decisions_) {
    size_t slash = key.find('/');
    put(fmt::format("moeserve_router_routing_decisions_total{{policy=\"{}\",decision=\"{}\"}} {}\n",
                    key.substr(0, slash), key.substr(slash + 1), n));
  }

  uint64_t hits = 0, misses = 0;
  for (const auto& [key, n] : decisions_) {
    if (key.ends_with("/cache_hit")) hits += n;
    if (key.ends_with("/cache_miss")) misses += n;
  }
  header(out, "moeserve_router_cache_aware_hit_ratio", "gauge",
         "cache_aware decisions that found a prefix above the threshold, over all prefix lookups.");
  put(fmt::format("moeserve_router_cache_aware_hit_ratio {}\n",
                  hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0));
  header(out, "moeserve_router_cache_aware_queried_symbols_total", "counter",
         "Symbols of requests looked up in the prefix trees.");
  put(fmt::format("moeserve_router_cache_aware_queried_symbols_total {}\n", cache_queried_symbols_));
  header(out, "moeserve_router_cache_aware_matched_symbols_total", "counter",
         "Symbols of those requests found in the chosen backend's prefix tree.");
  put(fmt::format("moeserve_router_cache_aware_matched_symbols_total {}\n", cache_matched_symbols_));

  int total = 0, max_in_flight = 0, live = 0;
  for (const auto& b : backends_) {
    if (b->removed || b->draining) continue;
    total += b->in_flight;
    max_in_flight = std::max(max_in_flight, b->in_flight);
    ++live;
  }
  double mean = live ? static_cast<double>(total) / live : 0.0;
  header(out, "moeserve_router_load_imbalance", "gauge",
         "Max over mean of the backends' in-flight requests (1 is perfectly balanced; 1 when idle).");
  put(fmt::format("moeserve_router_load_imbalance {}\n", mean > 0 ? max_in_flight / mean : 1.0));
  header(out, "moeserve_router_requests_in_flight", "gauge", "Requests being proxied now.");
  put(fmt::format("moeserve_router_requests_in_flight {}\n", total));

  header(out, "moeserve_router_responses_total", "counter",
         "Responses the router sent to clients, by HTTP status (its own errors included).");
  for (const auto& [code, n] : client_responses_)
    put(fmt::format("moeserve_router_responses_total{{code=\"{}\"}} {}\n", code, n));
  header(out, "moeserve_router_retries_total", "counter",
         "Requests sent again to another backend before any response byte reached the client, by reason.");
  for (const auto& [reason, n] : retries_)
    put(fmt::format("moeserve_router_retries_total{{reason=\"{}\"}} {}\n", escape_label(reason), n));
  header(out, "moeserve_router_no_backend_total", "counter", "Requests for which no backend was available.");
  put(fmt::format("moeserve_router_no_backend_total {}\n", no_backend_));
  return out;
}

}  // namespace moeserve::router
