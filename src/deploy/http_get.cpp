#include "deploy/http_get.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace moeserve::deploy {
namespace {

std::string decode_chunked(const std::string& body) {
  std::string out;
  size_t at = 0;
  while (at < body.size()) {
    size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) break;
    size_t len = std::strtoul(body.substr(at, eol - at).c_str(), nullptr, 16);
    if (len == 0) break;
    out += body.substr(eol + 2, len);
    at = eol + 2 + len + 2;
  }
  return out;
}

}  // namespace

HttpResponse http_get(const std::string& host, int port, const std::string& path, double timeout_seconds) {
  HttpResponse r;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    r.error = ::gai_strerror(rc);
    return r;
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto wait_for = [&](short events) {
    int left =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
                .count());
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, left) > 0;
  };
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS && wait_for(POLLOUT)) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    r.error = std::strerror(errno);
    ::close(fd);
    return r;
  }
  std::string req =
      fmt::format("GET {} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n", path, host, port);
  size_t sent = 0;
  while (sent < req.size() && wait_for(POLLOUT)) {
    ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string raw;
  char buf[16384];
  while (wait_for(POLLIN)) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  ::close(fd);
  size_t head_end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/1.") || head_end == std::string::npos) {
    r.error = raw.empty() ? "no answer" : "not an HTTP response";
    return r;
  }
  r.status = std::atoi(raw.c_str() + 9);
  std::string head = raw.substr(0, head_end);
  for (char& ch : head) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  r.body = raw.substr(head_end + 4);
  if (head.find("transfer-encoding: chunked") != std::string::npos) r.body = decode_chunked(r.body);
  return r;
}

}  // namespace moeserve::deploy
