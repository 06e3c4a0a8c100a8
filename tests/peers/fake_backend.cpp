#include "fake_backend.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "http_client.h"
#include "loopback.h"

namespace moeserve::peers {

namespace {

// Reads one HTTP/1.1 request from fd into `request`, with `buffer` carrying bytes across requests.
bool read_request(int fd, std::string& buffer, HttpRequest& request) {
  char temp[16384];
  size_t head_end;
  while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    ssize_t n = ::recv(fd, temp, sizeof temp, 0);
    if (n <= 0) return false;
    buffer.append(temp, static_cast<size_t>(n));
  }
  std::istringstream head(buffer.substr(0, head_end));
  std::string line;
  std::getline(head, line);
  std::istringstream first(line);
  first >> request.method >> request.target >> request.version;
  request.headers.clear();
  while (std::getline(head, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    request.headers[ascii_lower(line.substr(0, colon))] = trim_spaces(line.substr(colon + 1));
  }
  buffer.erase(0, head_end + 4);
  size_t length = 0;
  if (auto it = request.headers.find("content-length"); it != request.headers.end())
    length = std::stoul(it->second);
  while (buffer.size() < length) {
    ssize_t n = ::recv(fd, temp, sizeof temp, 0);
    if (n <= 0) return false;
    buffer.append(temp, static_cast<size_t>(n));
  }
  request.body = buffer.substr(0, length);
  buffer.erase(0, length);
  return true;
}

std::string reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

}  // namespace

// ---- BackendConnection ----------------------------------------------------------------------------------

bool BackendConnection::respond(int status, const std::string& body, const std::string& content_type,
                                const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  if (close_after_) out += "Connection: close\r\n";
  out += "\r\n" + body;
  return send_raw(out);
}

bool BackendConnection::start_stream(int status, const std::string& content_type) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  if (close_after_) out += "Connection: close\r\n";
  return send_raw(out + "\r\n");
}

bool BackendConnection::chunk(const std::string& data) {
  if (data.empty()) return true;
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return send_raw(size + data + "\r\n");
}

bool BackendConnection::end_stream() {
  return send_raw("0\r\n\r\n");
}

bool BackendConnection::send_raw(const std::string& bytes) {
  if (closed_) return false;
  return send_all(fd_, bytes.data(), bytes.size());
}

void BackendConnection::reset() {
  if (closed_) return;
  linger option{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &option, sizeof option);
  ::shutdown(fd_, SHUT_RDWR);
  closed_ = true;
}

void BackendConnection::close_after() {
  close_after_ = true;
}

void BackendConnection::hang_up() {
  hang_up_ = true;
}

// ---- FakeBackend ----------------------------------------------------------------------------------------

FakeBackend::FakeBackend(Handler handler, std::string name)
    : handler_(std::move(handler)), name_(std::move(name)) {
  listen_fd_ = listen_loopback(port_);
  acceptor_ = std::thread([this] { accept_loop(); });
}

FakeBackend::~FakeBackend() {
  stop();
}

void FakeBackend::stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

void FakeBackend::accept_loop() {
  for (;;) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ++accepted_;
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void FakeBackend::serve(int fd) {
  std::string buffer;
  for (;;) {
    HttpRequest request;
    if (!read_request(fd, buffer, request)) break;
    BackendConnection connection(fd);
    bool probe =
        request.target == "/health" || request.target == "/v1/models" || request.target == "/metrics";
    if (!probe) {
      std::lock_guard lock(mu_);
      requests_.push_back(request);
    }
    cv_.notify_all();
    handler_(request, connection);
    if (!connection.keep_open()) break;
  }
  std::lock_guard lock(mu_);
  std::erase(fds_, fd);
  ::close(fd);
  ++closed_;
  cv_.notify_all();
}

size_t FakeBackend::connections_closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

bool FakeBackend::wait_closed(size_t count, int timeout_ms) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return closed_ >= count; });
}

std::vector<HttpRequest> FakeBackend::requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

size_t FakeBackend::request_count() const {
  std::lock_guard lock(mu_);
  return requests_.size();
}

bool FakeBackend::wait_requests(size_t count, int timeout_ms) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return requests_.size() >= count; });
}

// ---- Gate -------------------------------------------------------------------------------------------------

void Gate::open() {
  {
    std::lock_guard lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

bool Gate::wait(int timeout_ms) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return open_; });
}

bool Gate::is_open() const {
  std::lock_guard lock(mu_);
  return open_;
}

}  // namespace moeserve::peers
