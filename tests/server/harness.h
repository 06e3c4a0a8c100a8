#pragma once
// An in-process server on a loopback port: the real HTTP layer, admission, metrics and OpenAI service, over
// whatever engine and tokenizer a test supplies (either may be null).

#include <memory>
#include <string>

#include "http_connection.h"
#include "server/admission.h"
#include "server/http.h"
#include "server/openai_service.h"
#include "server/server_metrics.h"

namespace moeserve::server {

struct Harness {
  explicit Harness(ServiceOptions options, Engine* engine = nullptr, const text::Tokenizer* tokenizer = nullptr,
                   AdmissionOptions admission_options = {.memory_pressure_threshold = 0}) {
    metrics = std::make_unique<ServerMetrics>(options.served_model_name);
    admission = std::make_unique<Admission>(admission_options, nullptr);
    service = std::make_unique<OpenAiService>(std::move(options), engine, tokenizer, *admission, *metrics);
    metrics->set_sources(nullptr, admission.get());
    HttpServerOptions http;
    http.host = "127.0.0.1";
    http.port = 0;
    http.threads = 2;
    http.on_protocol_error = [m = metrics.get()](int status) { m->request_error(status); };
    service->configure(http);
    server = std::make_unique<HttpServer>(http, [s = service.get()](HttpRequest& r) { return s->handle(r); });
    server->start();
  }
  ~Harness() {
    service->abort_all();
    server->stop(std::chrono::seconds(5));
  }

  uint16_t port() const { return server->port(); }
  testing_http::Response get(const std::string& path, std::vector<std::string> headers = {}) {
    testing_http::Connection c(port());
    return c.roundtrip("GET", path, "", headers);
  }
  testing_http::Response post(const std::string& path, const std::string& body,
                              std::vector<std::string> headers = {}) {
    testing_http::Connection c(port());
    return c.roundtrip("POST", path, body, headers);
  }

  std::unique_ptr<ServerMetrics> metrics;
  std::unique_ptr<Admission> admission;
  std::unique_ptr<OpenAiService> service;
  std::unique_ptr<HttpServer> server;
};

// The Qwen3 tokenizer fetched by scripts/fetch-test-data.sh.
inline const char* kQwen3TokenizerDir = ".cache/tokenizer-qwen3";

}  // namespace moeserve::server
