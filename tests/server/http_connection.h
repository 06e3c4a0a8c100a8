#pragma once
// The server tests' view of one connection, on the shared loopback client (tests/peers/http_client.h): it
// sends exactly the bytes a test asks for (malformed requests, huge bodies, half-sent headers) and reads a
// response whole, skipping interim 100 Continue heads, with each chunk of a chunked body as it arrives.

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "http_client.h"

namespace moeserve::testing_http {

struct Response {
  int status = 0;                              // 0: the connection closed or timed out before the end
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // the chunks as they arrived, when chunked
  bool ok() const { return status != 0; }
};

class Connection {
 public:
  // A hang guard only: a 300-token demo generation took 46 s once on the loaded 2-core machine.
  static constexpr std::chrono::milliseconds kResponseTimeout = std::chrono::seconds(180);

  explicit Connection(uint16_t port) : client_(port) {
    if (!client_.connected())
      throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
  }

  void close() { client_.close(); }
  // Half-closes: the server sees the end of the request stream (a truncated request ends here).
  void shutdown_write() { client_.shutdown_write(); }
  // Sends all bytes; false if the peer closed.
  bool send(const std::string& bytes) { return client_.send_raw(bytes); }

  static std::string request(const std::string& method, const std::string& path, const std::string& body = "",
                             const std::vector<std::string>& extra_headers = {}) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: test\r\n";
    for (auto& h : extra_headers) r += h + "\r\n";
    if (!body.empty() || method == "POST") {
      r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    return r + "\r\n" + body;
  }

  // Reads one response. on_chunk (optional) sees each chunk of a chunked body as it arrives; returning false
  // stops reading (the response is then incomplete: status 0). `timeout` bounds each wait for bytes.
  template <typename OnChunk>
  Response read_response_with(OnChunk on_chunk, std::chrono::milliseconds timeout = kResponseTimeout) {
    const int ms = static_cast<int>(timeout.count());
    peers::HttpResponse head;
    do {
      head = {};
      if (!client_.read_head(head, ms)) return {};
    } while (head.status == 100);
    Response r;
    r.headers = head.headers;
    const bool chunked = client_.chunked();
    while (auto piece = client_.read_chunk(head, ms)) {
      if (!chunked) continue;
      r.chunks.push_back(*piece);
      if (!on_chunk(*piece)) {
        r.body = head.body;
        return r;
      }
    }
    r.body = std::move(head.body);
    if (head.complete) r.status = head.status;
    return r;
  }
  Response read_response(std::chrono::milliseconds timeout = kResponseTimeout) {
    return read_response_with([](const std::string&) { return true; }, timeout);
  }

  Response roundtrip(const std::string& method, const std::string& path, const std::string& body = "",
                     const std::vector<std::string>& extra_headers = {}) {
    if (!send(request(method, path, body, extra_headers))) return {};
    return read_response();
  }

  // True if the server closed the connection (EOF) within the timeout.
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    return client_.wait_closed(static_cast<int>(timeout.count()));
  }

 private:
  peers::HttpClient client_;
};

// Splits an SSE body into the payloads of its "data: " lines.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

}  // namespace moeserve::testing_http
