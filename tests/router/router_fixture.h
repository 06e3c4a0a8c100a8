#pragma once
// What the in-process router tests share: a router config over loopback backends, a clock the test moves, and
// OpenAI-like bodies and answers.
#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "http_peer.h"
#include "router/router.h"

namespace moeserve::router::testing {

using json = nlohmann::json;

// A clock the test can move forward (fail_timeout, Retry-After) instead of sleeping.
struct TestClock {
  std::atomic<int64_t> offset_ms{0};
  std::function<TimePoint()> fn() {
    return [this] { return Clock::now() + std::chrono::milliseconds(offset_ms.load()); };
  }
  void advance(Duration d) { offset_ms += d.count(); }
};

inline RouterConfig config_for(const std::vector<std::string>& urls, Policy policy = Policy::least_conn) {
  RouterConfig config;
  config.host = "127.0.0.1";
  config.port = 0;
  config.workers = 2;
  config.policy = policy;
  config.health_interval = Duration(0);  // off unless a test wants it
  for (const auto& url : urls) {
    BackendSpec spec;
    spec.url = url;
    config.backends.push_back(spec);
  }
  return config;
}

inline std::string chat_body(const std::vector<std::pair<std::string, std::string>>& messages,
                             bool stream = false) {
  json body = {{"model", "demo"}, {"stream", stream}, {"messages", json::array()}};
  for (const auto& [role, content] : messages)
    body["messages"].push_back({{"role", role}, {"content", content}});
  return body.dump();
}

// A backend that answers every request with its name, non-streaming.
inline FakeBackend::Handler answer_with(std::string name) {
  return [name](const HttpRequest&, BackendConnection& c) {
    c.respond(200, json{{"backend", name}, {"choices", json::array()}}.dump());
  };
}

inline std::string backend_of(const HttpResponse& response) {
  auto body = json::parse(response.body, nullptr, false);
  return body.is_object() ? body.value("backend", std::string("?")) : std::string("?");
}

inline HttpResponse post_chat(uint16_t port, const std::string& body = chat_body({{"user", "hi"}})) {
  return http_request(port, "POST", "/v1/chat/completions", body);
}

}  // namespace moeserve::router::testing
