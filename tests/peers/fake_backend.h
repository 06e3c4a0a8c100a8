#pragma once
// A scripted HTTP server on loopback for the suites' peers, on plain blocking sockets so that a test controls
// every byte and every pause: FakeBackend hands each request to the test's handler, which answers whole,
// streams chunks (held back by a Gate while the test looks), fails, resets or hangs up. It records what it
// received (the router's probes of /health, /v1/models and /metrics left out). No Beast here, so the tests
// share none of the HTTP code they test.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace moeserve::peers {

struct HttpRequest {
  std::string method;
  std::string target;
  std::string version;                         // "HTTP/1.1"
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One accepted connection of a FakeBackend, handed to its handler per request.
class BackendConnection {
 public:
  explicit BackendConnection(int fd) : fd_(fd) {}
  // A whole response with Content-Length.
  bool respond(int status, const std::string& body, const std::string& content_type = "application/json",
               const std::vector<std::pair<std::string, std::string>>& headers = {});
  // A chunked response: start, then chunks, then end.
  bool start_stream(int status = 200, const std::string& content_type = "text/event-stream");
  bool chunk(const std::string& data);
  bool end_stream();
  bool send_raw(const std::string& bytes);
  void reset();        // abortive close (RST), as a crashing server
  void close_after();  // close the connection after this request instead of keeping it alive
  void hang_up();      // close it after this request without saying so (as a keep-alive timeout does)
  int fd() const { return fd_; }
  bool closed() const { return closed_; }
  bool keep_open() const { return !close_after_ && !hang_up_ && !closed_; }

 private:
  int fd_;
  bool closed_ = false;
  bool close_after_ = false;
  bool hang_up_ = false;
};

class FakeBackend {
 public:
  using Handler = std::function<void(const HttpRequest&, BackendConnection&)>;
  explicit FakeBackend(Handler handler, std::string name = "");
  ~FakeBackend();
  FakeBackend(const FakeBackend&) = delete;
  FakeBackend& operator=(const FakeBackend&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& name() const { return name_; }
  // Requests received (health checks and /v1/models excluded), in order.
  std::vector<HttpRequest> requests() const;
  size_t request_count() const;
  size_t connections_accepted() const { return accepted_; }
  // Connections this backend has closed (after hang_up, close_after, reset or the client's close).
  size_t connections_closed() const;
  bool wait_closed(size_t count, int timeout_ms = 10'000) const;
  // Blocks until `count` requests arrived (false after `timeout_ms`).
  bool wait_requests(size_t count, int timeout_ms = 10'000) const;
  void stop();  // closes the listener and every connection; later connects are refused

 private:
  void accept_loop();
  void serve(int fd);

  Handler handler_;
  std::string name_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> accepted_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<HttpRequest> requests_;
  size_t closed_ = 0;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// A latch a backend handler waits on and a test opens (or the reverse).
class Gate {
 public:
  void open();
  bool wait(int timeout_ms = 10'000);
  bool is_open() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace moeserve::peers
