#pragma once
// `moeserve route`: an HTTP/1.1 reverse proxy for OpenAI-compatible servers (Boost.Beast, C++20 coroutines).
// Streams every response through as it arrives, retries on another backend while nothing has reached the
// client, and routes with the Balancer's policies. Beast stays inside proxy.cpp; this header is cheap to
// include.

#include <cstdint>
#include <memory>

#include "router/balancer.h"
#include "router/config.h"

namespace moeserve::router {

class KeyEncoder;

class Router {
 public:
  // `encoder` turns request text into cache_aware symbols; nullptr keeps the bytes of the text.
  // `clock` drives every health timer (tests advance it instead of sleeping).
  explicit Router(RouterConfig config, std::shared_ptr<const KeyEncoder> encoder = nullptr,
                  std::function<TimePoint()> clock = Clock::now);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds the port (throws moeserve::Error when it cannot), starts the I/O threads and the health checks.
  void start();
  uint16_t port() const;  // the bound port (the real one when the config asked for port 0)

  // SIGTERM: stop accepting connections, /health and new requests answer 503, requests in flight get up to
  // shutdown_timeout. Those left then end as `serve` ends its own at its deadline: a stream with a chunk of
  // finish_reason "abort" and [DONE], a request without a response yet with a 503. Then the router stops.
  void drain();
  void end_in_flight();  // a second SIGTERM: drain with the deadline now
  void stop();           // now: in-flight requests are cut
  void wait();           // blocks until stopped

  Balancer& balancer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a router until SIGINT/SIGTERM (the first drains, the second ends what is in flight at once, a third
// stops). Returns the exit code.
int run_router(const RouterConfig& config, std::shared_ptr<const KeyEncoder> encoder = nullptr);

}  // namespace moeserve::router
