#include "router/balancer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/log.h"

namespace moeserve::router {

std::optional<int> RecentRoutes::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? std::nullopt : std::optional(it->second);
}

void RecentRoutes::set(const std::string& key, int backend) {
  auto [it, inserted] = map_.insert_or_assign(key, backend);
  if (!inserted) return;
  if (order_.size() < capacity_) {
    order_.push_back(key);
  } else {
    map_.erase(order_[head_]);
    order_[head_] = key;
    head_ = (head_ + 1) % capacity_;
  }
}

std::string_view decision_name(Decision decision) {
  switch (decision) {
    case Decision::policy:
      return "policy";
    case Decision::affinity:
      return "affinity";
    case Decision::cache_hit:
      return "cache_hit";
    case Decision::cache_miss:
      return "cache_miss";
    case Decision::imbalanced:
      return "imbalanced";
  }
  return "?";
}

void Histogram::observe(double seconds) {
  size_t i = std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin();
  ++counts[i];
  sum += seconds;
  ++count;
}

void Balancer::learn_response(const std::string& response_id, int backend_id) {
  std::lock_guard lock(mu_);
  responses_.set(response_id, backend_id);
}

Balancer::Balancer(const RouterConfig& config, std::function<TimePoint()> now, uint64_t seed)
    : config_(config), now_(std::move(now)), rng_(seed ? seed : std::random_device{}()) {
  for (const auto& spec : config_.backends) backends_.push_back(make_backend(spec));
}

std::shared_ptr<Backend> Balancer::make_backend(const BackendSpec& spec) {
  auto b = std::make_shared<Backend>(config_.max_tree_symbols);
  b->id = next_id_++;
  b->url = spec.url;
  b->address = parse_backend_url(spec.url);
  b->weight = spec.weight;
  b->effective_weight = spec.weight;
  b->current_weight = 0;
  b->max_fails = spec.max_fails >= 0 ? spec.max_fails : config_.max_fails;
  b->fail_timeout = spec.fail_timeout.count() >= 0 ? spec.fail_timeout : config_.fail_timeout;
  b->models = spec.models;
  b->models_configured = !spec.models.empty();
  return b;
}

// nginx ignores max_fails when the upstream has a single server (peers->single): there is nowhere else to go.
bool Balancer::ejected_by_fails(const Backend& b, TimePoint now) const {
  if (backends_.size() == 1) return false;
  return b.max_fails > 0 && b.fails >= b.max_fails && now - b.checked <= b.fail_timeout;
}

bool Balancer::available_locked(Backend& b, TimePoint now) {
  if (b.removed || b.draining || !b.healthy || now < b.busy_until) return false;
  if (ejected_by_fails(b, now)) return false;
  if (b.breaker == Backend::Breaker::open) {
    if (now - b.breaker_opened < config_.cb_timeout) return false;
    b.breaker = Backend::Breaker::half_open;
    b.breaker_successes = 0;
    b.breaker_trial = false;
  }
  if (b.breaker == Backend::Breaker::half_open && b.breaker_trial) return false;
  return true;
}

bool Balancer::available(const Backend& backend) {
  std::lock_guard lock(mu_);
  return available_locked(const_cast<Backend&>(backend), now_());
}

double Balancer::load(const Backend& b) const {
  return std::max(static_cast<double>(b.in_flight), b.reported_load);
}

std::vector<Backend*> Balancer::candidates_locked(const RouteRequest& request, std::span<const int> tried,
                                                  TimePoint now) {
  bool filter_model = false;
  if (!request.model.empty()) {
    for (const auto& b : backends_) {
      if (std::find(b->models.begin(), b->models.end(), request.model) != b->models.end()) {
        filter_model = true;
        break;
      }
    }
  }
  std::vector<Backend*> candidates;
  for (const auto& b : backends_) {
    if (std::find(tried.begin(), tried.end(), b->id) != tried.end()) continue;
    if (!available_locked(*b, now)) continue;
    // A backend whose models are not known yet may serve it; one that lists others does not.
    if (filter_model && !b->models.empty() &&
        std::find(b->models.begin(), b->models.end(), request.model) == b->models.end())
      continue;
    candidates.push_back(b.get());
  }
  return candidates;
}

bool Balancer::can_route(const RouteRequest& request, std::span<const int> tried) {
  std::lock_guard lock(mu_);
  return !candidates_locked(request, tried, now_()).empty();
}

std::optional<Selection> Balancer::pick(const RouteRequest& request, std::span<const int> tried) {
  std::lock_guard lock(mu_);
  TimePoint now = now_();
  std::vector<Backend*> candidates = candidates_locked(request, tried, now);
  if (candidates.empty()) {
    for (const auto& b : backends_) b->fails = 0;  // nginx: "mark them as live for quick recovery"
    ++no_backend_;
    return std::nullopt;
  }

  Decision decision = Decision::policy;
  Backend* chosen = nullptr;
  auto stay_on = [&](std::optional<int> id) {
    for (Backend* c : candidates)
      if (id && c->id == *id) chosen = c, decision = Decision::affinity;
  };
  // The backend that holds the response continued; when it is gone the policy picks one, which answers
  // 404 (it does not hold the response) rather than the request failing here.
  if (!request.previous_response.empty()) stay_on(responses_.find(request.previous_response));
  if (chosen == nullptr && config_.session_affinity && !request.session.empty())
    stay_on(sessions_.find(request.session));
  if (chosen == nullptr) {
    switch (config_.policy) {
      case Policy::least_conn:
        chosen = pick_least_conn(candidates);
        break;
      case Policy::round_robin:
        chosen = pick_round_robin(candidates);
        break;
      case Policy::random:
        chosen = pick_random(candidates);
        break;
      case Policy::power_of_two:
        chosen = pick_power_of_two(candidates);
        break;
      case Policy::cache_aware:
        chosen = pick_cache_aware(candidates, request, decision);
        break;
    }
  }
  if (config_.session_affinity && !request.session.empty()) sessions_.set(request.session, chosen->id);

  // nginx: a backend picked after fail_timeout since its last failure is "checked"; a success then clears
  // fails.
  if (now - chosen->checked > chosen->fail_timeout) chosen->checked = now;
  ++chosen->in_flight;
  Selection selection;
  selection.decision = decision;
  if (chosen->breaker == Backend::Breaker::half_open) {
    chosen->breaker_trial = true;
    selection.trial = true;
  }
  for (const auto& b : backends_)
    if (b.get() == chosen) selection.backend = b;
  ++decisions_[std::string(policy_name(config_.policy)) + "/" + std::string(decision_name(decision))];
  return selection;
}

// ngx_http_upstream_get_least_conn_peer: fewest connections relative to weight; ties go to smooth weighted
// round robin among the tied backends, so equal backends alternate exactly as behind nginx.
Backend* Balancer::pick_least_conn(const std::vector<Backend*>& candidates) {
  Backend* best = nullptr;
  bool many = false;
  size_t p = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    Backend* b = candidates[i];
    if (best == nullptr || int64_t{b->in_flight} * best->weight < int64_t{best->in_flight} * b->weight) {
      best = b;
      many = false;
      p = i;
    } else if (int64_t{b->in_flight} * best->weight == int64_t{best->in_flight} * b->weight) {
      many = true;
    }
  }
  if (many) {
    int total = 0;
    Backend* first = best;
    for (size_t i = p; i < candidates.size(); ++i) {
      Backend* b = candidates[i];
      if (int64_t{b->in_flight} * first->weight != int64_t{first->in_flight} * b->weight) continue;
      b->current_weight += b->effective_weight;
      total += b->effective_weight;
      if (b->effective_weight < b->weight) ++b->effective_weight;
      if (b->current_weight > best->current_weight) best = b;
    }
    best->current_weight -= total;
  }
  return best;
}

// ngx_http_upstream_get_peer: smooth weighted round robin.
Backend* Balancer::pick_round_robin(const std::vector<Backend*>& candidates) {
  Backend* best = nullptr;
  int total = 0;
  for (Backend* b : candidates) {
    b->current_weight += b->effective_weight;
    total += b->effective_weight;
    if (b->effective_weight < b->weight) ++b->effective_weight;
    if (best == nullptr || b->current_weight > best->current_weight) best = b;
  }
  best->current_weight -= total;
  return best;
}

Backend* Balancer::pick_random(const std::vector<Backend*>& candidates) {
  int total = 0;
  for (Backend* b : candidates) total += b->weight;
  int r = std::uniform_int_distribution<int>(0, total - 1)(rng_);
  for (Backend* b : candidates) {
    if (r < b->weight) return b;
    r -= b->weight;
  }
  return candidates.back();
}

Backend* Balancer::pick_power_of_two(const std::vector<Backend*>& candidates) {
  if (candidates.size() == 1) return candidates.front();
  size_t i = std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_);
  size_t j = std::uniform_int_distribution<size_t>(0, candidates.size() - 2)(rng_);
  if (j >= i) ++j;
  return load(*candidates[j]) < load(*candidates[i]) ? candidates[j] : candidates[i];
}

// Least loaded; ties go to the smaller prefix tree (it has the most room for new prefixes), then rotate.
Backend* Balancer::least_loaded(const std::vector<Backend*>& candidates) {
  Backend* best = nullptr;
  size_t n = candidates.size();
  size_t start = tie_breaker_++ % n;
  for (size_t k = 0; k < n; ++k) {
    Backend* b = candidates[(start + k) % n];
    if (best == nullptr || load(*b) < load(*best) ||
        (load(*b) == load(*best) && b->tree.size() < best->tree.size()))
      best = b;
  }
  return best;
}

// SGLang's cache-aware policy: when the load is imbalanced go to the least loaded backend; otherwise to the
// backend whose tree holds the longest prefix of the request, if it covers more than cache_threshold of it;
// otherwise to the least loaded. The request is then inserted into the chosen backend's tree.
Backend* Balancer::pick_cache_aware(const std::vector<Backend*>& candidates, const RouteRequest& request,
                                    Decision& decision) {
  double min_load = load(*candidates.front());
  double max_load = min_load;
  for (Backend* b : candidates) {
    min_load = std::min(min_load, load(*b));
    max_load = std::max(max_load, load(*b));
  }
  bool imbalanced = max_load - min_load > config_.balance_abs_threshold &&
                    max_load > min_load * config_.balance_rel_threshold;
  Backend* chosen = nullptr;
  if (request.key.empty()) {
    chosen = least_loaded(candidates);
    decision = Decision::policy;
    return chosen;
  }
  if (imbalanced) {
    chosen = least_loaded(candidates);
    decision = Decision::imbalanced;
  } else {
    Backend* best = nullptr;
    size_t best_match = 0;
    for (Backend* b : candidates) {
      size_t matched = b->tree.match_prefix(request.key);
      if (best == nullptr || matched > best_match || (matched == best_match && load(*b) < load(*best))) {
        best = b;
        best_match = matched;
      }
    }
    cache_queried_symbols_ += request.key.size();
    cache_matched_symbols_ += best_match;
    double ratio = static_cast<double>(best_match) / static_cast<double>(request.key.size());
    if (ratio > config_.cache_threshold) {
      chosen = best;
      decision = Decision::cache_hit;
    } else {
      chosen = least_loaded(candidates);
      decision = Decision::cache_miss;
    }
  }
  chosen->tree.insert(request.key);
  return chosen;
}

void Balancer::eject_count(Backend& b, std::string_view mechanism) {
  ++b.ejections[std::string(mechanism)];
}

void Balancer::finish(const Selection& selection, Outcome outcome, std::string_view reason) {
  std::lock_guard lock(mu_);
  Backend& b = *selection.backend;
  TimePoint now = now_();
  --b.in_flight;
  if (selection.trial) b.breaker_trial = false;
  if (outcome == Outcome::failure || outcome == Outcome::died) {
    ++b.failures[reason.empty() ? std::string("error") : std::string(reason)];
    bool died = outcome == Outcome::died;
    bool health_checked = config_.health_interval.count() > 0;
    // ngx_http_upstream_free_round_robin_peer with NGX_PEER_FAILED.
    if (backends_.size() > 1) {
      bool was_ejected = ejected_by_fails(b, now);
      ++b.fails;
      if (died && !health_checked) b.fails = std::max(b.fails, b.max_fails);
      b.accessed = now;
      b.checked = now;
      if (b.max_fails > 0) {
        b.effective_weight = std::max(0, b.effective_weight - b.weight / b.max_fails);
        if (b.fails >= b.max_fails && !was_ejected) {
          eject_count(b, died && !health_checked ? "died" : "max_fails");
          spdlog::warn("route: backend {} temporarily disabled for {} ms after {} (last: {})", b.url,
                       b.fail_timeout.count(),
                       died ? "it dropped a request" : fmt::format("{} failures", b.fails), reason);
        }
      }
      if (died && health_checked && b.healthy) {
        b.healthy = false;
        b.health_ok_streak = 0;
        eject_count(b, "died");
        spdlog::warn("route: backend {} out of rotation until {} health checks pass: {}", b.url,
                     config_.health_successes, reason);
      }
    }
    ++b.breaker_failures;
    if (b.breaker == Backend::Breaker::half_open ||
        (b.breaker == Backend::Breaker::closed && b.breaker_failures >= config_.cb_failures)) {
      if (b.breaker == Backend::Breaker::closed) {
        eject_count(b, "circuit_breaker");
        spdlog::warn("route: circuit breaker opened for backend {} after {} consecutive failures", b.url,
                     b.breaker_failures);
      }
      b.breaker = Backend::Breaker::open;
      b.breaker_opened = now;
    }
  } else if (outcome == Outcome::success) {
    if (b.accessed < b.checked) b.fails = 0;
    b.breaker_failures = 0;
    if (b.breaker == Backend::Breaker::half_open && selection.trial &&
        ++b.breaker_successes >= config_.cb_successes) {
      b.breaker = Backend::Breaker::closed;
      spdlog::info("route: circuit breaker closed for backend {}", b.url);
    }
  }
}

void Balancer::record_response(Backend& backend, std::string_view status, double ttfb_seconds,
                               double total_seconds) {
  std::lock_guard lock(mu_);
  ++backend.responses[std::string(status)];
  if (ttfb_seconds >= 0) backend.ttfb.observe(ttfb_seconds);
  if (total_seconds >= 0) backend.duration.observe(total_seconds);
}

void Balancer::retry_after(Backend& backend, Duration wait) {
  std::lock_guard lock(mu_);
  backend.busy_until = now_() + std::min(wait, config_.max_retry_after);
}

void Balancer::health_result(Backend& b, bool ok) {
  std::lock_guard lock(mu_);
  if (ok) {
    b.health_fail_streak = 0;
    if (!b.healthy && ++b.health_ok_streak >= config_.health_successes) {
      b.healthy = true;
      spdlog::info("route: backend {} passed {} health checks, back in rotation", b.url, b.health_ok_streak);
    }
  } else {
    b.health_ok_streak = 0;
    if (b.healthy && ++b.health_fail_streak >= config_.health_failures) {
      b.healthy = false;
      eject_count(b, "health_check");
      spdlog::warn("route: backend {} failed {} health checks, out of rotation", b.url, b.health_fail_streak);
    }
  }
}

void Balancer::set_models(Backend& backend, std::vector<std::string> ids, std::vector<std::string> cards) {
  std::lock_guard lock(mu_);
  backend.model_cards.clear();
  for (size_t i = 0; i < cards.size() && i < ids.size(); ++i)
    backend.model_cards.emplace_back(ids[i], std::move(cards[i]));
  if (!backend.models_configured) backend.models = std::move(ids);
}

void Balancer::set_reported_load(Backend& backend, double load, double kv_usage) {
  std::lock_guard lock(mu_);
  backend.reported_load = load;
  backend.reported_kv_usage = kv_usage;
}

void Balancer::count_client_response(int status) {
  std::lock_guard lock(mu_);
  ++client_responses_[status];
}

void Balancer::count_retry(std::string_view reason) {
  std::lock_guard lock(mu_);
  ++retries_[std::string(reason)];
}

std::shared_ptr<Backend> Balancer::add(const BackendSpec& spec) {
  auto backend = make_backend(spec);  // validates the URL before taking the lock
  std::lock_guard lock(mu_);
  for (const auto& b : backends_)
    if (b->url == spec.url && !b->removed) return nullptr;
  backends_.push_back(backend);
  return backend;
}

bool Balancer::drain(const std::string& url) {
  std::lock_guard lock(mu_);
  for (const auto& b : backends_) {
    if (b->url == url && !b->removed) {
      b->draining = true;
      return true;
    }
  }
  return false;
}

bool Balancer::remove(const std::string& url) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(backends_.begin(), backends_.end(), [&](const auto& b) { return b->url == url; });
  if (it == backends_.end()) return false;
  (*it)->removed = true;  // requests in flight keep their shared_ptr and finish normally
  backends_.erase(it);
  return true;
}

std::vector<std::shared_ptr<Backend>> Balancer::backends() const {
  std::lock_guard lock(mu_);
  return backends_;
}

std::vector<std::string> Balancer::model_cards() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  std::vector<std::string> seen;
  for (const auto& b : backends_) {
    for (const auto& [id, card] : b->model_cards) {
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      out.push_back(card);
    }
  }
  return out;
}

bool Balancer::serves_several_models() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> seen;
  for (const auto& b : backends_)
    for (const auto& m : b->models)
      if (std::find(seen.begin(), seen.end(), m) == seen.end()) seen.push_back(m);
  return seen.size() > 1;
}

int Balancer::in_flight() const {
  std::lock_guard lock(mu_);
  int total = 0;
  for (const auto& b : backends_) total += b->in_flight;
  return total;
}

std::string Balancer::state_locked(const Backend& b, TimePoint now) const {
  if (b.draining) return "draining";
  if (!b.healthy) return "unhealthy";
  if (ejected_by_fails(b, now)) return "ejected";
  if (b.breaker == Backend::Breaker::open && now - b.breaker_opened < config_.cb_timeout)
    return "circuit_open";
  if (b.breaker != Backend::Breaker::closed) return "half_open";
  if (now < b.busy_until) return "busy";
  return "healthy";
}

nlohmann::json Balancer::describe() const {
  std::lock_guard lock(mu_);
  TimePoint now = now_();
  auto seconds_until = [&](TimePoint t) { return std::chrono::duration<double>(t - now).count(); };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& b : backends_) {
    nlohmann::json item = {{"url", b->url},
                           {"state", state_locked(*b, now)},
                           {"in_flight", b->in_flight},
                           {"fails", b->fails},
                           {"weight", b->weight},
                           {"models", b->models},
                           {"prefix_tree_symbols", b->tree.size()}};
    uint64_t requests = 0;
    for (const auto& [status, n] : b->responses) requests += n;
    item["requests"] = requests;
    uint64_t failures = 0;
    for (const auto& [reason, n] : b->failures) failures += n;
    item["failures"] = failures;
    double until = 0;
    if (ejected_by_fails(*b, now)) until = std::max(until, seconds_until(b->checked + b->fail_timeout));
    if (b->breaker == Backend::Breaker::open)
      until = std::max(until, seconds_until(b->breaker_opened + config_.cb_timeout));
    if (now < b->busy_until) until = std::max(until, seconds_until(b->busy_until));
    item["ejected_for_seconds"] = until;
    if (b->reported_load >= 0) item["reported_load"] = b->reported_load;
    if (b->reported_kv_usage >= 0) item["reported_kv_usage"] = b->reported_kv_usage;
    out.push_back(std::move(item));
  }
  return out;
}

}  // namespace moeserve::router
