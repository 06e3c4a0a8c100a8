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
// 3. The same two front doors as `moeserve plan` writes them, in front of real `moeserve serve --model demo`
//    nodes: time to first byte and streamed requests/s (`--nodes 3`, `--only-nodes` for this part alone).
//
//   build/bench/router_bench --moeserve build/moeserve [--seconds 5] [--concurrency 32] [--chunks 64]
#include <fmt/format.h>
#include <signal.h>
#include <sys/utsname.h>

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

#include "deploy/http_get.h"
#include "deploy/plan.h"
#include "deploy/structured_file.h"
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

std::string default_body(bool stream) {
  return stream ? R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})"
                : R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
}

// A server may close a keep-alive connection after a response that says so (nginx does after
// `keepalive_requests`, 1000 by default); a client then opens a new one, as every HTTP client does.
bool server_closes(const HttpResponse& response) {
  std::string connection = response.header("connection");
  std::transform(connection.begin(), connection.end(), connection.begin(), ::tolower);
  return connection == "close";
}

// Sequential requests on one keep-alive connection; for streams the time to the first chunk. The first
// `warmup` requests are not counted (connections, caches).
std::vector<double> latency_samples(uint16_t port, int count, bool stream, const std::string& body,
                                    int warmup) {
  auto client = std::make_unique<HttpClient>(port);
  std::vector<double> samples;
  for (int i = 0; i < count + warmup; ++i) {
    auto start = Steady::now();
    client->send("POST", "/v1/chat/completions", body);
    HttpResponse response;
    if (!client->read_head(response, 120'000)) break;
    if (stream) client->read_chunk(response, 120'000);
    double elapsed = ms_since(start);
    while (client->read_chunk(response, 120'000)) {
    }
    if (i >= warmup) samples.push_back(elapsed);
    if (server_closes(response)) client = std::make_unique<HttpClient>(port);
  }
  return samples;
}

Latency measure_latency(uint16_t port, int count, bool stream) {
  auto samples = latency_samples(port, count, stream, default_body(stream), 50);
  return {percentile(samples, 0.5), percentile(samples, 0.99)};
}

struct Throughput {
  double requests_per_s = 0;
  double chunks_per_s = 0;
  int errors = 0;
};

Throughput measure_throughput(uint16_t port, int concurrency, double seconds, bool stream,
                              const std::string& body_text = "") {
  std::atomic<long> requests{0}, chunks{0};
  std::atomic<int> errors{0};
  auto deadline = Steady::now() + std::chrono::duration<double>(seconds);
  std::string body = body_text.empty() ? default_body(stream) : body_text;
  auto start = Steady::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      auto client = std::make_unique<HttpClient>(port);
      while (Steady::now() < deadline) {
        client->send("POST", "/v1/chat/completions", body);
        HttpResponse response;
        if (!client->read_head(response, 120'000) || response.status != 200) {
          ++errors;
          return;
        }
        long events = 0;
        while (auto piece = client->read_chunk(response, 120'000)) {
          for (size_t at = piece->find("data: "); at != std::string::npos; at = piece->find("data: ", at + 1))
            ++events;
        }
        if (!response.complete) {
          ++errors;
          return;
        }
        ++requests;
        chunks += events;
        if (server_closes(response)) client = std::make_unique<HttpClient>(port);
      }
    });
  }
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Steady::now() - start).count();
  return {requests / elapsed, chunks / elapsed, errors.load()};
}

std::unique_ptr<ChildProcess> start_route(const std::string& moeserve, uint16_t port,
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
  auto process = std::make_unique<ChildProcess>(argv, ChildOptions{.log_path = log});
  if (!wait_listening(port)) throw std::runtime_error("moeserve route did not start; see " + log);
  return process;
}

void overhead(const std::string& moeserve, const std::string& baseline, double seconds, int concurrency,
              int chunks, int samples, const std::vector<std::string>& paths) {
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
  ChildProcess nginx({"/usr/sbin/nginx", "-p", dir.string(), "-e", (dir / "error.log").string(), "-c",
                      (dir / "nginx.conf").string()},
                     {.log_path = (dir / "nginx.out").string()});
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
  std::unique_ptr<ChildProcess> baseline_route;
  if (!baseline.empty()) {
    uint16_t port = free_port();
    baseline_route =
        start_route(baseline, port, {backend.url()}, "least_conn", (dir / "route-baseline.log").string());
    targets.push_back({"route baseline", port});
  }
  std::printf("\n== overhead: one backend, concurrency %d, %d SSE chunks per stream, %.0f s per cell ==\n",
              concurrency, chunks, seconds);
  std::printf("%-16s %10s %10s %12s %12s %10s %14s\n", "path", "p50 ms", "p99 ms", "ttfb p50 ms",
              "ttfb p99 ms", "req/s", "chunks/s");
  for (const auto& target : targets) {
    if (!paths.empty() && std::find(paths.begin(), paths.end(), target.name) == paths.end()) continue;
    Latency small = measure_latency(target.port, 2 * samples, false);
    Latency ttfb = measure_latency(target.port, samples, true);
    Throughput requests = measure_throughput(target.port, concurrency, seconds, false);
    Throughput streams = measure_throughput(target.port, concurrency, seconds, true);
    std::printf("%-16s %10.3f %10.3f %12.3f %12.3f %10.0f %14.0f%s\n", target.name.c_str(), small.p50,
                small.p99, ttfb.p50, ttfb.p99, requests.requests_per_s, streams.chunks_per_s,
                requests.errors + streams.errors ? "  (errors!)" : "");
  }
  nginx.signal(SIGQUIT);
  nginx.wait_exit(std::chrono::seconds(10));
  route->signal(SIGTERM);
  route->wait_exit(std::chrono::seconds(10));
  if (baseline_route) {
    baseline_route->signal(SIGTERM);
    baseline_route->wait_exit(std::chrono::seconds(10));
  }
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
    route->wait_exit(std::chrono::seconds(10));
  }
}

// Real nodes: `moeserve serve --model demo` processes on 127.0.0.1, 127.0.0.2, ... (one port), and in front
// of them the two front doors exactly as `moeserve plan` writes them for that cluster: router/router.yaml for
// `moeserve route --config` and router/nginx.conf for nginx. Measured in rounds that alternate the paths
// (this machine's load drifts): time to first byte of a stream, sequentially on one keep-alive connection,
// and streamed requests/s with `concurrency` clients. "direct" is node 1 alone (a third of the cluster's
// capacity).
void real_nodes(const std::string& moeserve, const std::string& baseline, int nodes, double seconds,
                int concurrency, int rounds, int max_tokens) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("router-bench-nodes-" + std::to_string(::getpid()));
  fs::create_directories(dir / "nginx");
  uint16_t node_port = free_port(), route_port = free_port(), nginx_port = free_port();
  utsname host{};
  ::uname(&host);
  std::string yaml = "cluster: bench\nnodes:\n";
  std::string names;
  for (int i = 0; i < nodes; ++i) {
    yaml += fmt::format("  - {{name: n{}, host: 127.0.0.{}, gpu: cpu, arch: {}, memory: 4GB}}\n", i + 1,
                        i + 1, host.machine);
    names += fmt::format("{}n{}", i ? ", " : "", i + 1);
  }
  yaml += fmt::format(
      "models:\n  - {{name: demo, path: demo, config: tests/fixtures/models/tiny-moe/config.json, "
      "max_model_len: 4096, max_running_requests: 16, port: {}, router_port: {}, nodes: [{}]}}\n"
      "router: {{host: 127.0.0.1, listen: 127.0.0.1, port: {}}}\n"
      "monitoring: {{prometheus_port: {}, grafana_port: {}}}\n",
      node_port, nginx_port, names, route_port, free_port(), free_port());
  auto spec = moeserve::deploy::ClusterSpec::parse(
      moeserve::deploy::parse_structured_text(yaml, "bench.yaml"), "bench.yaml", ".");
  moeserve::deploy::write_plan(moeserve::deploy::make_plan(spec), (dir / "plan").string());

  std::vector<std::unique_ptr<ChildProcess>> servers;
  for (int i = 0; i < nodes; ++i) {
    std::string address = fmt::format("127.0.0.{}", i + 1);
    servers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{moeserve, "--log-level", "warn", "serve", "--model", "demo",
                                 "--served-model-name", "demo", "--host", address, "--port",
                                 std::to_string(node_port), "--cache-memory-gb", "0.05"},
        ChildOptions{.log_path = (dir / fmt::format("node-{}.log", i + 1)).string()}));
  }
  for (int i = 0; i < nodes; ++i) {
    bool up = false;
    for (int spin = 0; spin < 3000 && !up; ++spin) {
      up = moeserve::deploy::http_get(fmt::format("127.0.0.{}", i + 1), node_port, "/health").status == 200;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!up)
      throw std::runtime_error(
          fmt::format("node {} did not start; see {}/node-{}.log", i + 1, dir.string(), i + 1));
  }
  ChildProcess route(
      {moeserve, "--log-level", "warn", "route", "--config", (dir / "plan/router/router.yaml").string()},
      {.log_path = (dir / "route.log").string()});
  ChildProcess nginx({"/usr/sbin/nginx", "-p", (dir / "nginx").string(), "-e", "stderr", "-g", "daemon off;",
                      "-c", (dir / "plan/router/nginx.conf").string()},
                     {.log_path = (dir / "nginx.log").string()});
  if (!wait_listening(route_port) || !wait_listening(nginx_port))
    throw std::runtime_error("moeserve route or nginx did not start; see " + dir.string());

  std::string stream_body =
      json{{"model", "demo"},
           {"stream", true},
           {"max_tokens", max_tokens},
           {"ignore_eos", true},
           {"messages", {{{"role", "user"}, {"content", "Tell me about load balancers."}}}}}
          .dump();
  struct Target {
    std::string name;
    uint16_t port;
    std::vector<double> ttfb;
    double requests = 0, events = 0;
    int errors = 0;
  };
  // direct: node 1 (127.0.0.1:node_port).
  std::vector<Target> targets = {
      {"direct (node 1)", node_port, {}}, {"moeserve route", route_port, {}}, {"nginx", nginx_port, {}}};
  std::unique_ptr<ChildProcess> baseline_route;
  if (!baseline.empty()) {
    uint16_t port = free_port();
    baseline_route = std::make_unique<ChildProcess>(
        std::vector<std::string>{baseline, "--log-level", "warn", "route", "--config",
                                 (dir / "plan/router/router.yaml").string(), "--port", std::to_string(port)},
        ChildOptions{.log_path = (dir / "route-baseline.log").string()});
    if (!wait_listening(port)) throw std::runtime_error("the baseline router did not start");
    targets.push_back({"route baseline", port, {}});
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < targets.size(); ++k) {
      Target& t = targets[(k + size_t(round)) % targets.size()];
      auto samples = latency_samples(t.port, 60, true, stream_body, 5);
      t.ttfb.insert(t.ttfb.end(), samples.begin(), samples.end());
      Throughput streams = measure_throughput(t.port, concurrency, seconds, true, stream_body);
      t.requests += streams.requests_per_s / rounds;
      t.events += streams.chunks_per_s / rounds;
      t.errors += streams.errors;
    }
  }
  std::printf(
      "\n== real nodes: %d x `moeserve serve --model demo`, front doors as `moeserve plan` writes them; "
      "streams of "
      "%d tokens, %d clients, %d rounds x %.0f s ==\n",
      nodes, max_tokens, concurrency, rounds, seconds);
  std::printf("%-16s %12s %12s %14s %14s\n", "path", "ttfb p50 ms", "ttfb p99 ms", "streams/s",
              "SSE events/s");
  for (const auto& t : targets)
    std::printf("%-16s %12.2f %12.2f %14.1f %14.0f%s\n", t.name.c_str(), percentile(t.ttfb, 0.5),
                percentile(t.ttfb, 0.99), t.requests, t.events, t.errors ? "  (errors!)" : "");
  nginx.signal(SIGQUIT);
  nginx.wait_exit(std::chrono::seconds(10));
  route.signal(SIGTERM);
  route.wait_exit(std::chrono::seconds(10));
  if (baseline_route) {
    baseline_route->signal(SIGTERM);
    baseline_route->wait_exit(std::chrono::seconds(10));
  }
  for (auto& server : servers) server->signal(SIGTERM);
  for (auto& server : servers) server->wait_exit(std::chrono::seconds(30));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"router_bench: moeserve route vs nginx overhead, and cache_aware vs round_robin hit rate"};
  std::string moeserve = "build/moeserve";
  double seconds = 5;
  int concurrency = 32;
  int chunks = 64;
  int nodes = 3, rounds = 3, max_tokens = 32;
  bool only_nodes = false;
  std::vector<std::string> paths;
  int samples = 1000;
  std::string baseline;
  app.add_option("--moeserve", moeserve, "path of the moeserve binary")->capture_default_str();
  app.add_option("--seconds", seconds, "duration of each throughput cell")->capture_default_str();
  app.add_option("--concurrency", concurrency, "client connections for the throughput cells")
      ->capture_default_str();
  app.add_option("--chunks", chunks, "SSE events per streamed response")->capture_default_str();
  app.add_option("--nodes", nodes, "real `moeserve serve --model demo` nodes (0: skip that part)")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds over the real-node paths")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "tokens per stream from the real nodes")->capture_default_str();
  app.add_flag("--only-nodes", only_nodes, "run the real-node part alone");
  app.add_option("--samples", samples, "overhead part: streams timed for TTFB (twice as many small requests)")
      ->capture_default_str();
  app.add_option("--baseline", baseline,
                 "another moeserve binary whose router runs as one more path (\"route baseline\")");
  app.add_option("--paths", paths, "overhead part: only these paths (direct, \"moeserve route\", nginx)");
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  if (!only_nodes) {
    overhead(moeserve, baseline, seconds, concurrency, chunks, samples, paths);
    cache_hit_rate(moeserve);
  }
  if (nodes > 0) real_nodes(moeserve, baseline, nodes, seconds, concurrency, rounds, max_tokens);
  return 0;
}
