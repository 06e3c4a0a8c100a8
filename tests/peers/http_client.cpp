#include "http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <sstream>
#include <thread>

#include "child_process.h"

namespace moeserve::peers {

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim_spaces(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

bool send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

namespace {

int milliseconds_left(std::chrono::steady_clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

}  // namespace

HttpClient::HttpClient(uint16_t port, int receive_buffer) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  if (receive_buffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd_);
    fd_ = -1;
    return;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

HttpClient::~HttpClient() {
  close();
}

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void HttpClient::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

bool HttpClient::send(const std::string& method, const std::string& target, const std::string& body,
                      const HeaderList& headers) {
  std::string out = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    out += name + ": " + value + "\r\n";
    has_type = has_type || ascii_lower(name) == "content-type";
  }
  if (!body.empty() && !has_type) out += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST") out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "\r\n" + body;
  return send_raw(out);
}

bool HttpClient::send_raw(const std::string& bytes) {
  return fd_ >= 0 && send_all(fd_, bytes.data(), bytes.size());
}

bool HttpClient::wait_closed(int timeout_ms, std::string* received) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (received) received->append(buffer_);
  buffer_.clear();
  for (;;) {
    int left = milliseconds_left(deadline);
    if (fd_ < 0 || left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, left);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    char temp[8192];
    ssize_t n = ::recv(fd_, temp, sizeof temp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    if (received) received->append(temp, static_cast<size_t>(n));
  }
}

bool HttpClient::fill(int timeout_ms) {
  if (fd_ < 0 || eof_) return false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, milliseconds_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    char temp[65536];
    ssize_t n = ::recv(fd_, temp, sizeof temp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(temp, static_cast<size_t>(n));
    return true;
  }
}

bool HttpClient::read_head(HttpResponse& response, int timeout_ms) {
  size_t end;
  while ((end = buffer_.find("\r\n\r\n")) == std::string::npos)
    if (!fill(timeout_ms)) return false;
  std::istringstream head(buffer_.substr(0, end));
  buffer_.erase(0, end + 4);
  std::string line;
  std::getline(head, line);
  std::istringstream first(line);
  first >> response.version >> response.status;
  while (std::getline(head, line)) {
    size_t colon = line.find(':');
    if (colon != std::string::npos)
      response.headers[ascii_lower(line.substr(0, colon))] = trim_spaces(line.substr(colon + 1));
  }
  chunked_ = ascii_lower(response.header("transfer-encoding")).find("chunked") != std::string::npos;
  remaining_ = chunked_ || response.header("content-length").empty()
                   ? -1
                   : std::stoll(response.header("content-length"));
  body_done_ = remaining_ == 0 || response.status == 204 || response.status == 304 ||
               (response.status >= 100 && response.status < 200);
  if (body_done_) response.complete = true;
  return true;
}

std::optional<std::string> HttpClient::read_chunk(HttpResponse& response, int timeout_ms) {
  if (body_done_) return std::nullopt;
  if (chunked_) {
    size_t line_end;
    while ((line_end = buffer_.find("\r\n")) == std::string::npos)
      if (!fill(timeout_ms)) return std::nullopt;
    size_t size = std::stoul(buffer_.substr(0, line_end), nullptr, 16);
    while (buffer_.size() < line_end + 2 + size + 2)
      if (!fill(timeout_ms)) return std::nullopt;
    std::string data = buffer_.substr(line_end + 2, size);
    buffer_.erase(0, line_end + 2 + size + 2);
    if (size == 0) {
      body_done_ = true;
      response.complete = true;
      return std::nullopt;
    }
    response.body += data;
    return data;
  }
  if (buffer_.empty() && !fill(timeout_ms)) {
    if (remaining_ < 0 && eof_) {  // read to the server's close: the close is the end
      body_done_ = true;
      response.complete = true;
    }
    return std::nullopt;
  }
  size_t take = remaining_ < 0 ? buffer_.size() : std::min<size_t>(buffer_.size(), size_t(remaining_));
  std::string data = buffer_.substr(0, take);
  buffer_.erase(0, take);
  if (remaining_ > 0) {
    remaining_ -= static_cast<int64_t>(take);
    if (remaining_ == 0) {
      body_done_ = true;
      response.complete = true;
    }
  }
  response.body += data;
  return data;
}

bool HttpClient::read_until(HttpResponse& response, const std::string& text, int timeout_ms) {
  while (response.body.find(text) == std::string::npos)
    if (!read_chunk(response, timeout_ms)) return false;
  return true;
}

HttpResponse HttpClient::read_response(int timeout_ms) {
  HttpResponse response;
  if (!read_head(response, timeout_ms)) return response;
  while (read_chunk(response, timeout_ms)) {
  }
  return response;
}

HttpResponse http_request(uint16_t port, const std::string& method, const std::string& target,
                          const std::string& body, const HeaderList& headers, int timeout_ms) {
  HttpClient client(port);
  if (!client.connected() || !client.send(method, target, body, headers)) return {};
  return client.read_response(timeout_ms);
}

bool wait_listening(uint16_t port, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    HttpClient probe(port);
    if (probe.connected()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool wait_http_ok(uint16_t port, const std::string& path, ChildProcess* child,
                  std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (child && !child->running()) return false;
    if (http_request(port, "GET", path, "", {}, 5'000).status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace moeserve::peers
