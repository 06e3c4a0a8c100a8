#pragma once
// A deliberately small blocking HTTP/1.1 client on POSIX sockets for the server tests: it sends exactly the
// bytes a test asks for (malformed requests, huge bodies, half-sent headers) and decodes chunked replies.
// No Beast here, so the tests compile quickly and do not share the server's HTTP code.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace moeserve::testing_http {

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // the chunks as they arrived, when chunked
  bool ok() const { return status != 0; }
};

class Connection {
 public:
  static constexpr std::chrono::milliseconds kResponseTimeout = std::chrono::seconds(180);
  explicit Connection(uint16_t port, const char* host = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, host, &addr.sin_addr);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      throw std::runtime_error(std::string("connect failed: ") + std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Half-closes: the server sees the end of the request stream (a truncated request ends here).
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  // Sends all bytes; false if the peer closed.
  bool send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  static std::string request(const std::string& method, const std::string& path, const std::string& body = "",
                             const std::vector<std::string>& extra_headers = {}) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: test\r\n";
    for (auto& h : extra_headers) r += h + "\r\n";
    if (!body.empty() || method == "POST") {
      r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    return r + "\r\n" + body;
  }

  // Reads one response. on_chunk (optional) sees each chunk as it arrives; returning false stops reading
  // (the response is then incomplete). status 0 means the connection closed or timed out first. The default
  // timeout is a hang guard only: a 300-token demo generation took 46 s once on the loaded 2-core machine.
  template <typename OnChunk>
  Response read_response_with(OnChunk on_chunk, std::chrono::milliseconds timeout = kResponseTimeout) {
    Response r;
    deadline_ = std::chrono::steady_clock::now() + timeout;
    std::string line;
    if (!read_line(line)) return r;
    if (line.size() < 12 || line.compare(0, 5, "HTTP/") != 0) return r;
    int status = std::stoi(line.substr(9, 3));
    while (read_line(line) && !line.empty()) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = line.find_first_not_of(' ', colon + 1);
      r.headers[name] = v == std::string::npos ? "" : line.substr(v);
    }
    if (status == 100) return read_response_with(on_chunk, timeout);
    if (auto te = r.headers.find("transfer-encoding"); te != r.headers.end() && te->second == "chunked") {
      for (;;) {
        if (!read_line(line)) return r;
        size_t size = std::stoul(line, nullptr, 16);
        std::string chunk;
        if (!read_exact(size, chunk) || !read_line(line)) return r;
        if (size == 0) break;
        r.body += chunk;
        r.chunks.push_back(chunk);
        if (!on_chunk(chunk)) return r;
      }
    } else if (r.headers.count("content-length")) {
      if (!read_exact(std::stoul(r.headers["content-length"]), r.body)) return r;
    } else if (status != 204 && status != 304) {
      // No length: the body ends when the server closes the connection (RFC 9112 section 6.3).
      while (fill()) {
      }
      if (!eof_) return r;
      r.body = std::move(buffer_);
      buffer_.clear();
    }
    r.status = status;
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
    deadline_ = std::chrono::steady_clock::now() + timeout;
    std::string ignored;
    while (fill()) {
      buffer_.clear();
    }
    return eof_;
  }

 private:
  // Reads more bytes into buffer_; false on EOF, error or deadline.
  bool fill() {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }
  bool read_line(std::string& line) {
    size_t pos;
    while ((pos = buffer_.find("\r\n")) == std::string::npos) {
      if (!fill()) return false;
    }
    line = buffer_.substr(0, pos);
    buffer_.erase(0, pos + 2);
    return true;
  }
  bool read_exact(size_t n, std::string& out) {
    while (buffer_.size() < n) {
      if (!fill()) return false;
    }
    out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return true;
  }

  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
  std::chrono::steady_clock::time_point deadline_;
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
