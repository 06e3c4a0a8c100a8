// The HTTP server's own overhead on loopback, without a real model:
//   1. a trivial endpoint (GET /health) and a one-token completion under C keep-alive connections:
//      requests/s, p50/p99 latency;
//   2. streaming: tokens/s of the engine alone (a counting model, so the forward pass costs ~nothing) against
//      the same requests streamed over HTTP/SSE through the server; the difference is the HTTP layer.
// Usage: server_bench [seconds=5] [connections=8] [streams=32] [tokens=512]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "../../tests/server/http_connection.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "server/admission.h"
#include "server/http.h"
#include "server/openai_service.h"
#include "server/server_metrics.h"

namespace moeserve::server {
namespace {

using Clock = std::chrono::steady_clock;
using testing_http::Connection;

// Next token = last token + 1 (mod vocab): a model whose forward pass is nearly free.
class CountingModel : public ModelRunner {
 public:
  int64_t vocab_size() const override { return 256; }
  int64_t max_position_embeddings() const override { return 8192; }
  std::vector<int32_t> eos_token_ids() const override { return {255}; }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return {1, 1, 2, page_size, num_pages};
  }
  StateCacheSpec state_cache_spec(int num_slots) const override { return {1, 2, 2, 1, 1, 1, num_slots}; }
  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache&, StateCache&) override {
    ForwardOutput out;
    for (const auto& s : batch) {
      size_t rows = s.all_logits ? s.tokens.size() : 1;
      for (size_t r = 0; r < rows; ++r) {
        int32_t last = s.tokens[s.all_logits ? r : s.tokens.size() - 1];
        size_t base = out.logits.size();
        out.logits.resize(base + 256, 0.0f);
        out.logits[base + size_t((last + 1) % 255)] = 10.0f;
        ++out.rows;
      }
    }
    return out;
  }
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * double(v.size())))];
}

std::unique_ptr<Engine> make_engine() {
  EngineOptions eo;
  eo.cache_memory_bytes = 256 << 20;
  eo.max_running_requests = 64;
  eo.max_model_len = 8192;
  return Engine::create(std::make_unique<CountingModel>(), eo);
}

// Requests/s of one request shape under `connections` keep-alive connections, with p50/p99 latency.
void bench_requests(uint16_t port, double seconds, int connections, const char* what, const std::string& method,
                    const std::string& path, const std::string& body) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(connections);
  std::vector<std::thread> threads;
  for (int i = 0; i < connections; ++i) {
    threads.emplace_back([&, i] {
      Connection c(port);
      while (!stop) {
        auto t0 = Clock::now();
        auto r = c.roundtrip(method, path, body);
        if (r.status != 200) break;
        lat[i].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::printf("%s\n", fmt::format("{}, {} keep-alive connections, {:.0f} s: {:.0f} requests/s, p50 {:.0f} us, "
                                  "p99 {:.0f} us",
                                  what, connections, seconds, double(all.size()) / seconds, percentile(all, 0.5),
                                  percentile(all, 0.99))
                          .c_str());
}

// Tokens/s of `streams` concurrent requests of `tokens` tokens each, straight from the engine.
double engine_tokens_per_s(Engine& engine, int streams, int tokens) {
  std::vector<std::shared_ptr<OutputStream>> outs;
  auto t0 = Clock::now();
  for (int i = 0; i < streams; ++i) {
    auto s = std::make_shared<OutputStream>();
    GenerateRequest r;
    r.id = fmt::format("direct-{}", i);
    r.prompt = {1, 2, 3, int32_t(i % 200)};
    r.params.temperature = 0;
    r.params.max_tokens = tokens;
    r.params.ignore_eos = true;
    r.on_output = s->sink();
    engine.submit(std::move(r));
    outs.push_back(s);
  }
  size_t total = 0;
  for (auto& s : outs) total += s->collect().tokens.size();
  return double(total) / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The same through HTTP: streaming /v1/completions, every SSE chunk read by a client thread.
double http_tokens_per_s(uint16_t port, int streams, int tokens, size_t* chunks_out) {
  std::atomic<size_t> total{0}, chunks{0};
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      Connection c(port);
      std::string body =
          fmt::format(R"({{"prompt":[1,2,3,{}],"max_tokens":{},"temperature":0,"ignore_eos":true,)"
                      R"("stream":true,"return_token_ids":true}})",
                      i % 200, tokens);
      auto r = c.roundtrip("POST", "/v1/completions", body);
      for (auto& d : testing_http::sse_data(r.body)) {
        if (d == "[DONE]") continue;
        ++chunks;
        size_t at = d.find("\"token_ids\":[");
        if (at == std::string::npos) continue;
        size_t end = d.find(']', at);
        std::string list = d.substr(at + 13, end - at - 13);
        if (!list.empty()) total += size_t(std::count(list.begin(), list.end(), ',') + 1);
      }
    });
  }
  for (auto& t : threads) t.join();
  *chunks_out = chunks;
  return double(total) / std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 5;
  int connections = argc > 2 ? std::atoi(argv[2]) : 8;
  int streams = argc > 3 ? std::atoi(argv[3]) : 32;
  int tokens = argc > 4 ? std::atoi(argv[4]) : 512;

  auto engine = make_engine();
  ServiceOptions so;
  so.served_model_name = "counting";
  so.max_model_len = engine->capacity().max_model_len;
  ServerMetrics metrics(so.served_model_name);
  Admission admission({.max_running = 1024, .max_queued = 1024, .memory_pressure_threshold = 0}, nullptr);
  OpenAiService service(so, engine.get(), nullptr, admission, metrics);
  service.set_ready(true);
  HttpServerOptions ho;
  ho.host = "127.0.0.1";
  ho.port = 0;
  ho.threads = 1;
  service.configure(ho);  // as serve runs it: GETs inline, POSTs on the request threads
  HttpServer server(ho, [&](HttpRequest& r) { return service.handle(r); });
  server.start();
  std::printf("%u hardware threads; server: 1 IO thread, %d request threads\n",
              std::thread::hardware_concurrency(), ho.worker_threads);

  bench_requests(server.port(), seconds, connections, "GET /health", "GET", "/health", "");
  bench_requests(server.port(), seconds, connections, "POST /v1/completions (4 prompt ids, 1 token)", "POST",
                 "/v1/completions", R"({"prompt":[1,2,3,4],"max_tokens":1,"temperature":0})");

  engine_tokens_per_s(*engine, streams, 16);  // warm-up
  double direct = engine_tokens_per_s(*engine, streams, tokens);
  size_t chunks = 0;
  double http = http_tokens_per_s(server.port(), streams, tokens, &chunks);
  std::printf(
      "%s\n",
      fmt::format("streaming {} x {} tokens: engine alone {:.0f} tokens/s; over HTTP/SSE {:.0f} tokens/s "
                  "({} chunks); HTTP layer overhead {:.1f}%",
                  streams, tokens, direct, http, chunks, 100.0 * (1.0 - http / direct))
          .c_str());
  server.stop(std::chrono::seconds(2));
  engine->shutdown();
  return 0;
}

}  // namespace
}  // namespace moeserve::server

int main(int argc, char** argv) {
  return moeserve::server::run(argc, argv);
}
