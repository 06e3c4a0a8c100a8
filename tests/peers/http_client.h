#pragma once
// One small HTTP/1.1 client for the suites' loopback peers, on plain blocking sockets so that a test controls
// every byte and every pause: it sends what a test asks for (well-formed requests, or raw bytes that break
// the rules) and reads a response whole or piece by piece (a chunk at a time for chunked bodies). No Beast
// here, so the tests share none of the HTTP code they test. Timeouts are hang guards only.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::peers {

class ChildProcess;

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  std::string version;  // "HTTP/1.1"
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  bool complete = false;  // the body ended as framed (length, last chunk, or the server's close)
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A client connection to 127.0.0.1:port that can send several requests and read a response piece by piece.
class HttpClient {
 public:
  // receive_buffer > 0 sets SO_RCVBUF (a slow reader). connected() is false when nothing listens there.
  explicit HttpClient(uint16_t port, int receive_buffer = 0);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();
  // Half-closes: the server sees the end of the request stream (a truncated request ends here).
  void shutdown_write();

  // A request with Host, the headers given, Content-Type (JSON unless given) and Content-Length for a body or
  // a POST. False when the peer is gone.
  bool send(const std::string& method, const std::string& target, const std::string& body = "",
            const HeaderList& headers = {});
  // Bytes as they are, for requests that break the rules.
  bool send_raw(const std::string& bytes);

  // Reads the status line and headers; false on timeout or close.
  bool read_head(HttpResponse& response, int timeout_ms = 10'000);
  // Whether the body of the response whose head was read last is chunked.
  bool chunked() const { return chunked_; }
  // The next piece of body (a chunk's data for chunked responses), appended to response.body too; nullopt at
  // the end (response.complete) or on timeout or close (not complete).
  std::optional<std::string> read_chunk(HttpResponse& response, int timeout_ms = 10'000);
  // Reads body pieces until the body holds `text` (true), or the body ends or a read times out first (false).
  bool read_until(HttpResponse& response, const std::string& text, int timeout_ms = 10'000);
  HttpResponse read_response(int timeout_ms = 10'000);
  // True once the other side closed the connection (EOF or reset) within `timeout_ms`. The bytes that came
  // before the close are appended to `received` when given, else dropped.
  bool wait_closed(int timeout_ms = 10'000, std::string* received = nullptr);

 private:
  bool fill(int timeout_ms);
  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
  bool chunked_ = false;
  int64_t remaining_ = -1;  // content-length left; -1 until the body starts or when reading to EOF
  bool body_done_ = false;
};

// One request on a fresh connection; status 0 when nothing answered.
HttpResponse http_request(uint16_t port, const std::string& method, const std::string& target,
                          const std::string& body = "", const HeaderList& headers = {},
                          int timeout_ms = 10'000);

// True once something accepts connections on 127.0.0.1:port (polls up to timeout_ms).
bool wait_listening(uint16_t port, int timeout_ms = 10'000);

// Polls GET `path` until it answers 200 (true), or `child` (when given) exits, or the timeout passes (false).
// A server that is still loading answers 503 or does not listen yet.
bool wait_http_ok(uint16_t port, const std::string& path, ChildProcess* child,
                  std::chrono::milliseconds timeout);

// Shared with the suites' scripted servers.
std::string ascii_lower(std::string s);
std::string trim_spaces(std::string s);  // leading spaces, trailing spaces and '\r'
bool send_all(int fd, const char* data, size_t size);

}  // namespace moeserve::peers
