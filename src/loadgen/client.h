#pragma once
// The load generator: an asynchronous HTTP/1.1 client (Boost.Beast + C++20 coroutines on one thread) that
// plays dialogues of a scenario against an OpenAI-compatible server and times every streamed chunk.
// Beast stays inside client.cpp; this header is plain C++.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/prompt.h"
#include "loadgen/record.h"
#include "loadgen/scenario.h"

namespace moeserve::loadgen {

// http://host[:port][/prefix]; a trailing /v1 is accepted and folded into the API paths.
struct Endpoint {
  std::string host;
  std::string port = "80";
  std::string prefix;  // without a trailing '/', and without the /v1

  static Endpoint parse(std::string_view url);  // throws moeserve::Error on https or a malformed URL
  std::string url() const;
  std::string api(std::string_view path) const { return prefix + "/v1" + std::string(path); }
};

struct HttpResponse {
  int status = 0;  // 0: no response (see error)
  std::string body;
  std::string error;
};

// One blocking GET (for /version, /v1/models), bounded by timeout_s.
HttpResponse http_get(const Endpoint& endpoint, const std::string& target, const std::string& api_key,
                      double timeout_s);
// One blocking POST of a JSON body (for probing what a server accepts), bounded by timeout_s.
HttpResponse http_post_json(const Endpoint& endpoint, const std::string& target, const std::string& body,
                            const std::string& api_key, double timeout_s);

struct LoadOptions {
  size_t concurrency = 1;   // most requests in flight (with a request rate: 0 = no cap)
  double request_rate = 0;  // dialogues started per second, Poisson arrivals; 0 = closed loop
  size_t num_requests = 0;  // stop issuing after this many requests; 0 = no bound
  double duration_s = 0;    // stop issuing after this many seconds; 0 = no bound
  double request_timeout_s = 600;
  uint64_t seed = 0;  // for the arrival times
  std::string api_key;
};

struct Progress {
  size_t issued = 0, completed = 0, failed = 0, in_flight = 0;
  size_t planned = 0;  // num_requests, 0 when bounded by time only
  double elapsed_s = 0, duration_s = 0;
  bool finished = false;
};
using ProgressFn = std::function<void(const Progress&)>;

struct LoadResult {
  std::vector<RequestRecord> records;  // in issue order
  double duration_s = 0;               // first request sent -> last response ended
  bool interrupted = false;            // stopped by SIGINT
};

// Runs until the request/time bound is reached and every request in flight has ended. A first Ctrl-C stops
// issuing and cancels what is in flight; the records so far are returned.
LoadResult run_load(const Endpoint& endpoint, const LoadOptions& load, const WorkloadOptions& workload,
                    const PromptGenerator& prompts, const ProgressFn& progress = {});

}  // namespace moeserve::loadgen
