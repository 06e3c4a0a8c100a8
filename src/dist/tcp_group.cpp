#include "dist/tcp_group.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "common/error.h"

namespace moeserve::dist {
namespace {

using Clock = std::chrono::steady_clock;

int open_socket(const addrinfo& ai) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype, ai.ai_protocol);
  check(fd >= 0, "socket(): {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

std::pair<std::string, int> split_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  check(colon != std::string::npos && colon + 1 < s.size(), "--dist-init-addr '{}' must be HOST:PORT", s);
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(s.substr(colon + 1), &used);
    check(used == s.size() - colon - 1, "");
  } catch (...) {
    fail("--dist-init-addr '{}': the port is not a number", s);
  }
  check(port > 0 && port < 65536, "--dist-init-addr '{}': port out of range", s);
  return {host.empty() ? "0.0.0.0" : host, port};
}

TcpGroup::TcpGroup(const std::string& host_port, int rank, int size, double timeout_s)
    : rank_(rank), size_(size) {
  auto [host, port] = split_host_port(host_port);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = rank == 0 ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  // Rank 0 listens on every interface at PORT: HOST is how the others reach it, not necessarily a local name.
  int rc = ::getaddrinfo(rank == 0 ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &found);
  check(rc == 0 && found, "--dist-init-addr {}: cannot resolve: {}", host_port, ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);

  if (rank == 0) {
    listen_fd_ = open_socket(*found);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    check(::bind(listen_fd_, found->ai_addr, found->ai_addrlen) == 0 && ::listen(listen_fd_, size) == 0,
          "rank 0 cannot listen on port {} (--dist-init-addr {}): {}", port, host_port, std::strerror(errno));
    peers_.assign(size_t(size - 1), -1);
    for (int accepted = 0; accepted < size - 1;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      check(left > 0, "rank 0: only {} of {} ranks connected to port {} within {} s", accepted + 1, size,
            port, timeout_s);
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, int(std::min<int64_t>(left, 1000))) <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      int32_t peer = -1;
      recv_all(fd, &peer, sizeof peer, -1);
      check(peer > 0 && peer < size && peers_[size_t(peer - 1)] < 0,
            "rank 0: a process connected as rank {}, which is out of range or taken (check --node-rank)",
            peer);
      peers_[size_t(peer - 1)] = fd;
      ++accepted;
    }
    return;
  }

  for (;;) {
    int fd = open_socket(*found);
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      peers_.push_back(fd);
      break;
    }
    int err = errno;
    ::close(fd);
    check(Clock::now() < deadline, "rank {}: cannot reach rank 0 at {} within {} s: {}", rank, host_port,
          timeout_s, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  int32_t me = rank;
  send_all(peers_[0], &me, sizeof me, 0);
}

TcpGroup::~TcpGroup() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpGroup::send_all(int fd, const void* data, size_t n, int peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    check(sent > 0, "rank {}: lost the connection to rank {} ({}); a rank of the group died", rank_, peer,
          std::strerror(errno));
    p += sent;
    n -= size_t(sent);
  }
}

void TcpGroup::recv_all(int fd, void* data, size_t n, int peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    check(got > 0, "rank {}: rank {} closed the connection{}; a rank of the group died", rank_, peer,
          got < 0 ? fmt::format(" ({})", std::strerror(errno)) : "");
    p += got;
    n -= size_t(got);
  }
}

void TcpGroup::broadcast(std::vector<uint8_t>& bytes) {
  if (rank_ == 0) {
    uint64_t n = bytes.size();
    for (int r = 1; r < size_; ++r) {
      send_all(peers_[size_t(r - 1)], &n, sizeof n, r);
      send_all(peers_[size_t(r - 1)], bytes.data(), bytes.size(), r);
    }
    return;
  }
  uint64_t n = 0;
  recv_all(peers_[0], &n, sizeof n, 0);
  bytes.resize(size_t(n));
  recv_all(peers_[0], bytes.data(), bytes.size(), 0);
}

void TcpGroup::barrier() {
  uint8_t token = 1;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) recv_all(peers_[size_t(r - 1)], &token, 1, r);
    for (int r = 1; r < size_; ++r) send_all(peers_[size_t(r - 1)], &token, 1, r);
    return;
  }
  send_all(peers_[0], &token, 1, 0);
  recv_all(peers_[0], &token, 1, 0);
}

}  // namespace moeserve::dist
