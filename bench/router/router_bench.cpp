// router_bench: what `moeserve route` costs and what cache_aware buys, on this machine, in one run.
//
// 1. Overhead, side by side with the real nginx configured as the reference deployment configures it, both
// with
//    one worker, in front of the same in-process backend: added latency (p50/p99 of a small request and of
//    the time to first byte of a stream, over direct), requests/s and streamed chunks/s at a given
//    concurrency.
// 2. cache_aware vs round_robin on a shared-prefix multi-turn workload (SGLang's generated-shared-prefix
// shape):
//    each backend keeps its own LRU prefix cache of what it served and reports the cached fraction of every
//    prompt, as a server's `cached_tokens` would.
//
//   build/bench/router_bench --moeserve build/moeserve [--seconds 5] [--concurrency 32] [--chunks 64]
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "http_peer.h"
#include "router/prefix_tree.h"
#include "router/request_info.h"

namespace {

using namespace moeserve::router;
using namespace moeserve::router::testing;
using Steady = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_since(Steady::time_point t) {
  return std::chrono::duration<double, std::milli>(Steady::now() - t).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct Latency {
  double p50 = 0, p99 = 0;
};

// Sequential requests on one keep-alive connection; for streams the time to the first chunk.
Latency measure_latency(uint16_t port, int count, bool stream) {
  HttpClient client(port);
  std::vector<double> samples;
  std::string body = stream ? R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})"
                            : R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
  for (int i = 0; i < count + 50; ++i) {
    auto start = Steady::now();
    client.send("POST", "/v1/chat/completions", body);
    HttpResponse response;
    if (!client.read_head(response)) break;
    if (stream) client.read_chunk(response);
    double elapsed = ms_since(start);
    while (client.read_chunk(response)) {
    }
    if (i >= 50) samples.push_back(elapsed);  // the first 50 warm up connections and caches
  }
  return {percentile(samples, 0.5), percentile(samples, 0.99)};
}

struct Throughput {
  double requests_per_s = 0;
  double chunks_per_s = 0;
  int errors = 0;
};

Throughput measure_throughput(uint16_t port, int concurrency, double seconds, bool stream) {
  std::atomic<long> requests{0}, chunks{0};
  std::atomic<int> errors{0};
  auto deadline = Steady::now() + std::chrono::duration<double>(seconds);
  std::string body = stream ? R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})"
                            : R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
  auto start = Steady::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      HttpClient client(port);
      while (Steady::now() < deadline) {
        client.send("POST", "/v1/chat/completions", body);
        HttpResponse response;
        if (!client.read_head(response) || response.status != 200) {
          ++errors;
          return;
        }
        long events = 0;
        while (auto piece = client.read_chunk(response)) {
          for (size_t at = piece->find("data: "); at != std::string::npos; at = piece->find("data: ", at + 1))
            ++events;
        }
        if (!response.complete) {
          ++errors;
          return;
        }
        ++requests;
        chunks += events;
      }
    });
  }
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Steady::now() - start).count();
  return {requests / elapsed, chunks / elapsed, errors.load()};
}

std::unique_ptr<Process> start_route(const std::string& moeserve, uint16_t port,
                                     const std::vector<std::string>& backends, const std::string& policy,
                                     const std::string& log) {
  std::vector<std::string> argv = {moeserve,
                                   "--log-level",
                                   "warn",
                                   "route",
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(port),
                                   "--workers",
                                   "1",
                                   "--policy",
                                   policy,
                                   "--health-interval",
                                   "0"};
  for (const auto& b : backends) {
    argv.push_back("--backend");
    argv.push_back(b);
  }
  auto process = std::make_unique<Process>(argv, log);
  if (!wait_listening(port)) throw std::runtime_error("moeserve route did not start; see " + log);
  return process;
}

void overhead(const std::string& moeserve, double seconds, int concurrency, int chunks) {
  std::string event = sse_event("token");
  FakeBackend backend([&](const HttpRequest& r, BackendConnection& c) {
    if (r.body.find("\"stream\":true") != std::string::npos) {
      c.start_stream();
      for (int i = 0; i < chunks; ++i) c.chunk(event);
      c.chunk("data: [DONE]\n\n");
      c.end_stream();
    } else {
      c.respond(200, R"({"id":"x","object":"chat.completion","choices":[{"message":{"content":"ok"}}]})");
    }
  });
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("router-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  uint16_t nginx_port = free_port();
  std::ofstream(dir / "nginx.conf") << nginx_reference_config(dir.string(), nginx_port, {backend.url()});
  Process nginx({"/usr/sbin/nginx", "-p", dir.string(), "-e", (dir / "error.log").string(), "-c",
                 (dir / "nginx.conf").string()},
                (dir / "nginx.out").string());
  if (!wait_listening(nginx_port))
    throw std::runtime_error("nginx did not start (install it: scripts/install-deps.sh)");
  uint16_t route_port = free_port();
  auto route = start_route(moeserve, route_port, {backend.url()}, "least_conn", (dir / "route.log").string());

  struct Target {
    std::string name;
    uint16_t port;
  };
  std::vector<Target> targets = {
      {"direct", backend.port()}, {"moeserve route", route_port}, {"nginx", nginx_port}};
  std::printf("\n== overhead: one backend, concurrency %d, %d SSE chunks per stream, %.0f s per cell ==\n",
              concurrency, chunks, seconds);
  std::printf("%-16s %10s %10s %12s %12s %10s %14s\n", "path", "p50 ms", "p99 ms", "ttfb p50 ms",
              "ttfb p99 ms", "req/s", "chunks/s");
  for (const auto& target : targets) {
    Latency small = measure_latency(target.port, 2000, false);
    Latency ttfb = measure_latency(target.port, 1000, true);
    Throughput requests = measure_throughput(target.port, concurrency, seconds, false);
    Throughput streams = measure_throughput(target.port, concurrency, seconds, true);
    std::printf("%-16s %10.3f %10.3f %12.3f %12.3f %10.0f %14.0f%s\n", target.name.c_str(), small.p50,
                small.p99, ttfb.p50, ttfb.p99, requests.requests_per_s, streams.chunks_per_s,
                requests.errors + streams.errors ? "  (errors!)" : "");
  }
  nginx.signal(SIGQUIT);
  nginx.wait();
  route->signal(SIGTERM);
  route->wait();
}

// A backend with its own prefix cache: an LRU radix tree of the prompts it served, bounded like KV memory.
struct CachingBackend {
  std::mutex mu;
  PrefixTree cache;
  size_t prompt_symbols = 0, cached_symbols = 0;
  std::unique_ptr<FakeBackend> server;

  explicit CachingBackend(size_t capacity) : cache(capacity) {
    server = std::make_unique<FakeBackend>([this](const HttpRequest& r, BackendConnection& c) {
      KeyEncoder bytes;
      auto key =
          describe_request(r.body, "", BodyNeeds{.key = true, .session = false, .model = false}, bytes).key;
      size_t cached;
      {
        std::lock_guard lock(mu);
        cached = cache.match_prefix(key);
        cache.insert(key);
        prompt_symbols += key.size();
        cached_symbols += cached;
      }
      c.respond(
          200, json{{"usage",
                     {{"prompt_tokens", key.size()}, {"prompt_tokens_details", {{"cached_tokens", cached}}}}}}
                   .dump());
    });
  }
};

void cache_hit_rate(const std::string& moeserve) {
  constexpr int kBackends = 4, kGroups = 8, kConversations = 8, kTurns = 4;
  constexpr size_t kCacheSymbols = 60'000;  // per backend: room for about two groups' conversations
  std::printf(
      "\n== cache_aware vs round_robin: %d backends (prefix cache of %zu symbols each), %d groups x %d "
      "conversations x %d turns, 2000-char system prompt per group ==\n",
      kBackends, kCacheSymbols, kGroups, kConversations, kTurns);
  std::printf("%-14s %12s %18s\n", "policy", "hit rate", "requests/backend");
  for (std::string policy : {"round_robin", "cache_aware"}) {
    std::vector<std::unique_ptr<CachingBackend>> backends;
    std::vector<std::string> urls;
    for (int i = 0; i < kBackends; ++i) {
      backends.push_back(std::make_unique<CachingBackend>(kCacheSymbols));
      urls.push_back(backends.back()->server->url());
    }
    uint16_t port = free_port();
    auto route = start_route(moeserve, port, urls, policy, "/tmp/router-bench-cache.log");
    std::mt19937 rng(7);
    auto text = [&](size_t n, int seed) {
      std::mt19937 r(seed);
      std::string s;
      while (s.size() < n) s += "w" + std::to_string(r() % 100000) + " ";
      return s.substr(0, n);
    };
    std::vector<std::pair<int, int>> order;
    for (int g = 0; g < kGroups; ++g)
      for (int c = 0; c < kConversations; ++c) order.emplace_back(g, c);
    for (int turn = 0; turn < kTurns; ++turn) {
      std::shuffle(order.begin(), order.end(), rng);
      for (auto [g, c] : order) {
        json messages = json::array({{{"role", "system"}, {"content", text(2000, g)}}});
        for (int t = 0; t <= turn; ++t) {
          messages.push_back({{"role", "user"}, {"content", text(200, 1000 + g * 100 + c * 10 + t)}});
          if (t < turn)
            messages.push_back({{"role", "assistant"}, {"content", text(300, 5000 + g * 100 + c * 10 + t)}});
        }
        auto response = http_request(port, "POST", "/v1/chat/completions",
                                     json{{"model", "m"}, {"messages", messages}}.dump());
        if (response.status != 200) throw std::runtime_error("request failed: " + response.body);
      }
    }
    size_t prompt = 0, cached = 0;
    std::string spread;
    for (auto& b : backends) {
      prompt += b->prompt_symbols;
      cached += b->cached_symbols;
      spread += std::to_string(b->server->request_count()) + " ";
    }
    std::printf("%-14s %11.1f%% %18s\n", policy.c_str(),
                100.0 * static_cast<double>(cached) / static_cast<double>(prompt), spread.c_str());
    route->signal(SIGTERM);
    route->wait();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"router_bench: moeserve route vs nginx overhead, and cache_aware vs round_robin hit rate"};
  std::string moeserve = "build/moeserve";
  double seconds = 5;
  int concurrency = 32;
  int chunks = 64;
  app.add_option("--moeserve", moeserve, "path of the moeserve binary")->capture_default_str();
  app.add_option("--seconds", seconds, "duration of each throughput cell")->capture_default_str();
  app.add_option("--concurrency", concurrency, "client connections for the throughput cells")
      ->capture_default_str();
  app.add_option("--chunks", chunks, "SSE events per streamed response")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  overhead(moeserve, seconds, concurrency, chunks);
  cache_hit_rate(moeserve);
  return 0;
}
