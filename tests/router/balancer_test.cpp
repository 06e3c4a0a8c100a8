// The balancer's rules, with a clock the test moves: nginx's max_fails/fail_timeout and
// least_conn/round-robin order, the circuit breaker, 429 back-off, health checks, cache_aware and affinity.
#include "router/balancer.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/metrics.h"

namespace moeserve::router {
namespace {

using namespace std::chrono_literals;

struct FakeClock {
  TimePoint now = TimePoint{} + 1000h;
  std::function<TimePoint()> fn() {
    return [this] { return now; };
  }
};

RouterConfig config_with(int backends, Policy policy = Policy::least_conn) {
  RouterConfig config;
  config.policy = policy;
  for (int i = 0; i < backends; ++i) {
    BackendSpec spec;
    spec.url = "http://127.0.0.1:" + std::to_string(9000 + i);
    config.backends.push_back(spec);
  }
  return config;
}

int pick_id(Balancer& balancer, const RouteRequest& request = {}, std::span<const int> tried = {}) {
  auto selection = balancer.pick(request, tried);
  return selection ? selection->backend->id : -1;
}

TEST(Balancer, LeastConnPrefersFewestInFlightAndAlternatesTies) {
  FakeClock clock;
  Balancer balancer(config_with(3), clock.fn());
  std::vector<Selection> held;
  for (int i = 0; i < 6; ++i) held.push_back(*balancer.pick({}));
  // Equal backends fill up evenly, in nginx's smooth round-robin order among ties.
  std::map<int, int> per_backend;
  for (auto& s : held) ++per_backend[s.backend->id];
  EXPECT_EQ(per_backend, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(held[0].backend->id, 0);  // the first tie goes to the first backend, as in nginx
  // Backend 1 finishes both of its requests: it is now the least loaded.
  for (auto& s : held)
    if (s.backend->id == 1) balancer.finish(s, Outcome::success);
  EXPECT_EQ(pick_id(balancer), 1);
  EXPECT_EQ(pick_id(balancer), 1);
}

TEST(Balancer, RoundRobinFollowsWeights) {
  FakeClock clock;
  RouterConfig config = config_with(2, Policy::round_robin);
  config.backends[0].weight = 2;
  Balancer balancer(config, clock.fn());
  std::vector<int> ids;
  for (int i = 0; i < 6; ++i) {
    auto s = balancer.pick({});
    ids.push_back(s->backend->id);
    balancer.finish(*s, Outcome::success);
  }
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 0, 0, 1, 0}));  // nginx smooth weighted round robin
}

TEST(Balancer, EjectsAfterMaxFailsForFailTimeoutLikeNginx) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  config.max_fails = 3;
  config.fail_timeout = 30s;
  Balancer balancer(config, clock.fn());
  auto backend0 = balancer.backends()[0];
  for (int i = 0; i < 3; ++i) {
    std::vector<int> tried{1};  // force backend 0
    auto s = balancer.pick({}, tried);
    ASSERT_EQ(s->backend->id, 0);
    balancer.finish(*s, Outcome::failure, "connect");
    clock.now += 1s;
  }
  EXPECT_FALSE(balancer.available(*backend0));
  EXPECT_EQ(backend0->ejections.at("max_fails"), 1u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pick_id(balancer), 1);
  // Still out exactly fail_timeout after the last failure; back one instant later.
  clock.now += 29s;  // the last failure was 30s ago: still out (nginx: now - checked <= fail_timeout)
  EXPECT_FALSE(balancer.available(*backend0));
  clock.now += 1ms;
  EXPECT_TRUE(balancer.available(*backend0));
  // The probe succeeds: nginx clears fails only because the pick came after fail_timeout ("checked").
  std::vector<int> tried{1};
  auto probe = balancer.pick({}, tried);
  ASSERT_EQ(probe->backend->id, 0);
  balancer.finish(*probe, Outcome::success);
  EXPECT_EQ(backend0->fails, 0);
}

TEST(Balancer, FailuresAccumulateAcrossSuccessesInsideTheWindowLikeNginx) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  Balancer balancer(config, clock.fn());
  auto backend0 = balancer.backends()[0];
  std::vector<int> only0{1};
  auto fail_once = [&] { balancer.finish(*balancer.pick({}, only0), Outcome::failure, "reset"); };
  fail_once();
  fail_once();
  balancer.finish(*balancer.pick({}, only0), Outcome::success);  // within fail_timeout: fails stay at 2
  EXPECT_EQ(backend0->fails, 2);
  fail_once();
  EXPECT_FALSE(balancer.available(*backend0));
}

TEST(Balancer, WhenNothingIsAvailableFailCountsResetForQuickRecovery) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  config.max_fails = 1;
  Balancer balancer(config, clock.fn());
  balancer.finish(*balancer.pick({}), Outcome::failure, "connect");
  balancer.finish(*balancer.pick({}), Outcome::failure, "connect");
  EXPECT_FALSE(balancer.pick({}).has_value());  // both ejected: this request fails...
  EXPECT_TRUE(balancer.pick({}).has_value());   // ...and the next one tries again, as nginx does
}

TEST(Balancer, SingleBackendIsNeverEjectedByMaxFails) {
  FakeClock clock;
  RouterConfig config = config_with(1);
  config.cb_failures = 100;  // isolate nginx's rule from the circuit breaker
  Balancer balancer(config, clock.fn());
  for (int i = 0; i < 10; ++i) balancer.finish(*balancer.pick({}), Outcome::failure, "connect");
  EXPECT_EQ(pick_id(balancer), 0);
}

TEST(Balancer, CircuitBreakerOpensHalfOpensAndCloses) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  config.max_fails = 0;  // isolate the breaker from nginx's rule
  config.cb_failures = 3;
  config.cb_successes = 2;
  config.cb_timeout = 10s;
  Balancer balancer(config, clock.fn());
  auto b0 = balancer.backends()[0];
  std::vector<int> only0{1};
  for (int i = 0; i < 3; ++i) balancer.finish(*balancer.pick({}, only0), Outcome::failure, "status 503");
  EXPECT_FALSE(balancer.available(*b0));
  EXPECT_EQ(b0->ejections.at("circuit_breaker"), 1u);
  clock.now += 10s;
  auto trial = balancer.pick({}, only0);
  ASSERT_TRUE(trial && trial->trial);
  EXPECT_FALSE(balancer.pick({}, only0).has_value());  // one trial at a time
  balancer.finish(*trial, Outcome::success);
  auto second = balancer.pick({}, only0);
  ASSERT_TRUE(second && second->trial);
  balancer.finish(*second, Outcome::success);
  EXPECT_EQ(b0->breaker, Backend::Breaker::closed);
  auto normal = balancer.pick({}, only0);
  EXPECT_FALSE(normal->trial);
}

TEST(Balancer, RetryAfterKeepsRequestsAwayForTheGivenTime) {
  FakeClock clock;
  Balancer balancer(config_with(2), clock.fn());
  auto b0 = balancer.backends()[0];
  balancer.retry_after(*b0, 5s);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pick_id(balancer), 1);
  clock.now += 5s;
  EXPECT_TRUE(balancer.available(*b0));
}

TEST(Balancer, HealthChecksTakeOutAndBringBack) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  Balancer balancer(config, clock.fn());
  auto b0 = balancer.backends()[0];
  balancer.health_result(*b0, false);
  balancer.health_result(*b0, false);
  EXPECT_TRUE(balancer.available(*b0));
  balancer.health_result(*b0, false);
  EXPECT_FALSE(balancer.available(*b0));
  balancer.health_result(*b0, true);
  EXPECT_FALSE(balancer.available(*b0));
  balancer.health_result(*b0, true);
  EXPECT_TRUE(balancer.available(*b0));
}

// A backend that died on a request is out at once: until health checks pass when they run, else for
// fail_timeout like a max_fails ejection; never as the only backend.
TEST(Balancer, ABackendThatDiedOnARequestIsOutAtOnce) {
  FakeClock clock;
  RouterConfig config = config_with(2);
  config.health_interval = Duration(0);
  config.fail_timeout = 30s;
  {
    Balancer balancer(config, clock.fn());
    auto b0 = balancer.backends()[0];
    balancer.finish(*balancer.pick({}), Outcome::died, "closed");
    EXPECT_FALSE(balancer.available(*b0));
    EXPECT_EQ(b0->ejections.at("died"), 1u);
    EXPECT_EQ(b0->breaker, Backend::Breaker::closed);  // one failure for the circuit breaker, as any other
    clock.now += 30s + 1ms;
    EXPECT_TRUE(balancer.available(*b0));
  }
  config.health_interval = 10s;
  config.health_successes = 2;
  {
    Balancer balancer(config, clock.fn());
    auto b0 = balancer.backends()[0];
    balancer.finish(*balancer.pick({}), Outcome::died, "closed");
    EXPECT_FALSE(balancer.available(*b0));
    clock.now += 1h;
    EXPECT_FALSE(balancer.available(*b0)) << "only health checks bring it back";
    balancer.health_result(*b0, true);
    EXPECT_FALSE(balancer.available(*b0));
    balancer.health_result(*b0, true);
    EXPECT_TRUE(balancer.available(*b0));
    EXPECT_EQ(b0->ejections.at("died"), 1u);
  }
  Balancer single(config_with(1), clock.fn());
  single.finish(*single.pick({}), Outcome::died, "closed");
  EXPECT_EQ(pick_id(single), 0) << "the only backend stays: there is nowhere else to go";
}

RouteRequest keyed(const std::string& text) {
  RouteRequest r;
  r.key.assign(text.begin(), text.end());
  return r;
}

TEST(Balancer, CacheAwareFollowsTheLongestPrefixWhileBalanced) {
  FakeClock clock;
  Balancer balancer(config_with(3, Policy::cache_aware), clock.fn());
  std::map<std::string, int> home;
  // Conversations share only "user\n" (under the 0.3 threshold), each turn extends its previous one.
  auto opening = [](const std::string& name) {
    return "user\n" + name + " asks a question that is long enough to be its own conversation\n";
  };
  for (std::string conversation : {"alpha", "bravo", "charlie"}) {
    std::string text = opening(conversation);
    auto s = balancer.pick(keyed(text));
    EXPECT_EQ(s->decision, Decision::cache_miss);
    home[conversation] = s->backend->id;
    balancer.finish(*s, Outcome::success);
  }
  // Three new conversations spread over the three backends (ties go to the emptiest tree).
  EXPECT_EQ(std::set<int>({home["alpha"], home["bravo"], home["charlie"]}).size(), 3u);
  for (std::string conversation : {"charlie", "alpha", "bravo"}) {
    std::string text = opening(conversation) + "assistant\nok\n";
    auto s = balancer.pick(keyed(text));
    EXPECT_EQ(s->decision, Decision::cache_hit);
    EXPECT_EQ(s->backend->id, home[conversation]);
    balancer.finish(*s, Outcome::success);
  }
}

TEST(Balancer, CacheAwareGoesToTheLeastLoadedWhenImbalanced) {
  FakeClock clock;
  RouterConfig config = config_with(2, Policy::cache_aware);
  config.balance_abs_threshold = 2;
  config.balance_rel_threshold = 1.5;
  Balancer balancer(config, clock.fn());
  auto first = balancer.pick(keyed("shared prefix of a conversation"));
  int home = first->backend->id;
  std::vector<Selection> held{*first};
  for (int i = 0; i < 2; ++i) {
    auto s = balancer.pick(keyed("shared prefix of a conversation, turn " + std::to_string(i)));
    EXPECT_EQ(s->decision, Decision::cache_hit);
    EXPECT_EQ(s->backend->id, home);
    held.push_back(*s);
  }
  // home has 3 in flight, the other 0: 3 - 0 > 2 and 3 > 0 * 1.5.
  auto s = balancer.pick(keyed("shared prefix of a conversation, turn 9"));
  EXPECT_EQ(s->decision, Decision::imbalanced);
  EXPECT_NE(s->backend->id, home);
}

TEST(Balancer, SessionAffinityPinsASessionWhileItsBackendIsUp) {
  FakeClock clock;
  RouterConfig config = config_with(3, Policy::round_robin);
  config.session_affinity = true;
  Balancer balancer(config, clock.fn());
  RouteRequest request;
  request.session = "user-42";
  int home = pick_id(balancer, request);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pick_id(balancer, request), home);
  balancer.drain(balancer.backends()[home]->url);
  int moved = pick_id(balancer, request);
  EXPECT_NE(moved, home);
  EXPECT_EQ(pick_id(balancer, request), moved);
}

// A request continuing a response goes to the backend that answered with it, whatever the policy and the
// session say; when that backend is gone, the policy picks (the backend then answers 404).
TEST(Balancer, PreviousResponseGoesToTheBackendThatHoldsIt) {
  FakeClock clock;
  RouterConfig config = config_with(3, Policy::round_robin);
  config.session_affinity = true;
  Balancer balancer(config, clock.fn());
  balancer.learn_response("resp_a", 2);
  balancer.learn_response("resp_b", 0);
  RouteRequest request;
  request.previous_response = "resp_a";
  request.session = "s";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pick_id(balancer, request), 2);
  request.previous_response = "resp_b";
  EXPECT_EQ(pick_id(balancer, request), 0);
  const int tried[] = {0};  // it failed there: another one
  EXPECT_NE(pick_id(balancer, request, tried), 0);
  balancer.drain(balancer.backends()[2]->url);
  request.previous_response = "resp_a";
  EXPECT_NE(pick_id(balancer, request), 2);
  request.previous_response = "resp_unknown";
  EXPECT_GE(pick_id(balancer, request), 0);
}

TEST(RecentRoutes, KeepsTheMostRecentKeys) {
  RecentRoutes routes(3);
  for (int i = 0; i < 5; ++i) routes.set("k" + std::to_string(i), i);
  EXPECT_EQ(routes.size(), 3u);
  EXPECT_EQ(routes.find("k1"), std::nullopt);
  EXPECT_EQ(routes.find("k4"), 4);
  routes.set("k4", 7);  // moved, not added: nothing dropped
  EXPECT_EQ(routes.find("k2"), 2);
  EXPECT_EQ(routes.find("k4"), 7);
}

TEST(Balancer, ModelsRestrictCandidates) {
  FakeClock clock;
  Balancer balancer(config_with(2), clock.fn());
  auto backends = balancer.backends();
  balancer.set_models(*backends[0], {"big"}, {R"({"id":"big"})"});
  balancer.set_models(*backends[1], {"small"}, {R"({"id":"small"})"});
  RouteRequest request;
  request.model = "small";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pick_id(balancer, request), 1);
  EXPECT_TRUE(balancer.serves_several_models());
  EXPECT_EQ(balancer.model_cards().size(), 2u);
}

TEST(Balancer, DescribesBackendsAndRendersMetrics) {
  FakeClock clock;
  Balancer balancer(config_with(2), clock.fn());
  auto s = balancer.pick({});
  balancer.record_response(*s->backend, "200", 0.01, 0.5);
  balancer.finish(*s, Outcome::success);
  auto described = balancer.describe();
  ASSERT_EQ(described.size(), 2u);
  EXPECT_EQ(described[0]["state"], "healthy");
  MetricsRegistry registry;
  balancer.export_metrics(registry);
  std::string metrics = registry.render();
  EXPECT_NE(metrics.find(
                "moeserve_router_backend_requests_total{backend=\"http://127.0.0.1:9000\",status=\"200\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find(
                "moeserve_router_backend_request_duration_seconds_bucket{backend=\"http://127.0.0.1:9000\","
                "le=\"0.5\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::router
