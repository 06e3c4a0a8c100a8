#pragma once
// The HTTP/1.1 layer, kept free of Boost headers so that only http_server.cpp pays Beast's compile cost.
//
// A Handler turns a parsed request into a Reply: either a complete response, or an AsyncBody that another
// thread (the engine) fills over time. Handlers run on a bounded worker pool, so parsing and tokenizing a
// large request never holds up the IO threads (cheap requests may run inline, see
// HttpServerOptions::runs_inline). The connection polls an AsyncBody on its own strand, writes what is ready,
// and sleeps until the body's waker fires or its deadline passes. Writes are awaited one at a time, so a slow
// reader slows only its own stream (output accumulates in the body and goes out in one larger write): TCP
// flow control is the backpressure, and the engine thread never blocks on a socket.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::server {

using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;   // after '?', undecoded
  Headers headers;     // names lower-cased
  std::string body;
  std::string remote;  // peer address, for logs

  // The first header with this (lower-case) name, or "".
  std::string_view header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  Headers headers;
  std::string body;
};

// A response produced over time. All methods except wake-up delivery run on the connection's strand.
class AsyncBody {
 public:
  struct Head {
    int status = 200;
    std::string content_type;
    Headers headers;
    bool chunked = false;  // true: stream `data` as it comes (SSE); false: `data` is the whole body
  };
  struct Step {
    std::optional<Head> head;                  // given exactly once, before or with the first data
    std::string data;                          // bytes ready to write now
    bool done = false;                         // no more data will follow
    std::optional<Clock::time_point> wake_at;  // poll again at this time even without a wake-up
  };

  virtual ~AsyncBody() = default;
  // Called once before the first poll. `wake` may be called from any thread, any number of times, also after
  // the connection is gone; it makes the connection poll again soon.
  virtual void start(std::function<void()> wake) = 0;
  virtual Step poll(Clock::time_point now) = 0;
  // The client went away or the server is shutting down: stop the work. poll() is not called afterwards.
  virtual void cancel() = 0;
};

struct Reply {
  HttpResponse response;            // used when body is null
  std::shared_ptr<AsyncBody> body;  // deferred response
  Headers headers{};                // added to either (X-Request-Id, CORS)
};

using Handler = std::function<Reply(HttpRequest&)>;

// Sees a request's head (method, path, query, headers; the body is empty) as soon as it is parsed. A response
// returned here is sent instead of reading the body (a 401 costs no body bytes); the connection then closes
// unless the request had no body.
using HeadCheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 30000;               // 0 picks a free port (see HttpServer::port)
  int threads = 1;                     // IO threads
  size_t max_body_bytes = 32 << 20;    // larger bodies get 413
  size_t max_header_bytes = 64 << 10;  // larger headers get 431
  // Request bodies buffered at once over all connections. A request whose Content-Length does not fit in what
  // is left gets 503 before its body is read; a chunked body is charged chunk by chunk as it arrives.
  size_t max_buffered_body_bytes = 256 << 20;
  size_t max_connections = 1024;  // more are accepted, answered 503 and closed
  // Handlers run on a pool of this many threads, off the IO threads, except where runs_inline says so; 0 runs
  // every handler on the IO threads. Requests waiting for a worker beyond max_queued_work get 503.
  int worker_threads = 2;
  size_t max_queued_work = 256;
  std::function<bool(const HttpRequest& head)> runs_inline;  // cheap requests (/health): on the IO thread
  HeadCheck on_head;
  std::chrono::seconds header_timeout{30};      // to receive a complete request once it has started
  std::chrono::seconds keep_alive_timeout{60};  // idle time between requests on one connection
  std::chrono::seconds write_timeout{60};       // a write that makes no progress this long drops the client
  std::string server_header = "moeserve";
  // Told the status of every error the HTTP layer answers itself (400 malformed, 413, 431, 501, 503 over a
  // limit), for metrics.
  std::function<void(int status)> on_protocol_error;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the IO threads; throws moeserve::Error if the address cannot be bound.
  void start();
  uint16_t port() const;
  // Connections with a response in progress (handlers on the worker pool, deferred bodies being generated or
  // written).
  size_t active_responses() const;
  size_t open_connections() const;
  size_t buffered_body_bytes() const;  // charged against max_buffered_body_bytes now
  // Stops accepting, waits up to `grace` for responses in progress to finish writing, then closes every
  // connection and joins the IO threads. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::server
