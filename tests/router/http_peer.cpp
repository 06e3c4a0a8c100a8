#include "http_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace moeserve::router::testing {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

bool write_all(int fd, const char* data, size_t size) {
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
  first >> request.method >> request.target;
  request.headers.clear();
  while (std::getline(head, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    request.headers[lower(line.substr(0, colon))] = trim(line.substr(colon + 1));
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
  return write_all(fd_, bytes.data(), bytes.size());
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
  listen_fd_ = peers::listen_loopback(port_);
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

// ---- HttpClient -------------------------------------------------------------------------------------------

HttpClient::HttpClient(uint16_t port, int receive_buffer) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
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

void HttpClient::send(const std::string& method, const std::string& target, const std::string& body,
                      const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string out = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    out += name + ": " + value + "\r\n";
    has_type = has_type || lower(name) == "content-type";
  }
  if (!body.empty() && !has_type) out += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST") out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "\r\n" + body;
  write_all(fd_, out.data(), out.size());
}

bool HttpClient::send_raw(const std::string& bytes) {
  return write_all(fd_, bytes.data(), bytes.size());
}

bool HttpClient::wait_closed(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count());
    if (fd_ < 0 || left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) return false;
    char temp[4096];
    if (::recv(fd_, temp, sizeof temp, 0) <= 0) return true;
  }
}

bool HttpClient::fill(int timeout_ms) {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char temp[65536];
  ssize_t n = ::recv(fd_, temp, sizeof temp, 0);
  if (n <= 0) return false;
  buffer_.append(temp, static_cast<size_t>(n));
  return true;
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
      response.headers[lower(line.substr(0, colon))] = trim(line.substr(colon + 1));
  }
  chunked_ = lower(response.header("transfer-encoding")).find("chunked") != std::string::npos;
  remaining_ = chunked_ || response.header("content-length").empty()
                   ? -1
                   : std::stoll(response.header("content-length"));
  body_done_ = remaining_ == 0 || response.status == 204 || response.status == 304;
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
    if (remaining_ < 0) {  // read to EOF: the end is the end
      body_done_ = true;
      response.complete = true;
    }
    return std::nullopt;
  }
  size_t take = remaining_ < 0 ? buffer_.size() : std::min<size_t>(buffer_.size(), remaining_);
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

HttpResponse HttpClient::read_response(int timeout_ms) {
  HttpResponse response;
  if (!read_head(response, timeout_ms)) return response;
  while (read_chunk(response, timeout_ms)) {
  }
  return response;
}

HttpResponse http_request(uint16_t port, const std::string& method, const std::string& target,
                          const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& headers, int timeout_ms) {
  HttpClient client(port);
  if (!client.connected()) return {};
  client.send(method, target, body, headers);
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

// ---- Process ----------------------------------------------------------------------------------------------

Process::Process(const std::vector<std::string>& argv, const std::string& log_path) {
  pid_ = ::fork();
  if (pid_ == 0) {
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) {
      ::dup2(log, 1);
      ::dup2(log, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
}

Process::~Process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    wait(5000);
  }
}

void Process::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool Process::running() {
  if (pid_ <= 0 || status_ != -1) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

int Process::wait(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      status_ = -2;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

std::string nginx_reference_config(const std::string& d, uint16_t port, const std::vector<std::string>& urls,
                                   bool least_conn) {
  std::string servers;
  for (const auto& url : urls) servers += "    server " + url.substr(7) + " max_fails=3 fail_timeout=30s;\n";
  return "worker_processes 1;\ndaemon off;\nmaster_process off;\npid " + d + "/nginx.pid;\nerror_log " + d +
         "/error.log warn;\nevents { worker_connections 4096; }\nhttp {\n  access_log off;\n"
         "  client_body_temp_path " +
         d + "/body;\n  proxy_temp_path " + d +
         "/proxy;\n"
         "  fastcgi_temp_path " +
         d + "/fastcgi;\n  uwsgi_temp_path " + d +
         "/uwsgi;\n"
         "  scgi_temp_path " +
         d +
         "/scgi;\n"
         "  upstream llm {\n" +
         (least_conn ? "    least_conn;\n" : "") + servers +
         "    keepalive 32;\n    keepalive_timeout 300s;\n  }\n"
         "  server {\n    listen 127.0.0.1:" +
         std::to_string(port) +
         ";\n    location / {\n"
         "      proxy_pass http://llm;\n      proxy_http_version 1.1;\n      proxy_set_header Connection "
         "\"\";\n"
         "      proxy_buffering off;\n      proxy_read_timeout 300s;\n      proxy_send_timeout 300s;\n"
         "    }\n  }\n}\n";
}

std::string sse_event(const std::string& content) {
  return "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
         content + "\"}}]}\n\n";
}

}  // namespace moeserve::router::testing
