#include "loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace moeserve::peers {
namespace {

// Binds `fd` to 127.0.0.1:port (0: a kernel-chosen port) and returns the port bound (0 when the bind failed).
uint16_t bind_loopback(int fd, uint16_t port = 0) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return 0;
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

bool port_is_free(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const bool free = fd >= 0 && bind_loopback(fd, port) == port;
  if (fd >= 0) ::close(fd);
  return free;
}

}  // namespace

int listen_loopback(uint16_t& port, int backlog) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  port = bind_loopback(fd);
  if (port == 0 || ::listen(fd, backlog) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot listen on 127.0.0.1: " + why);
  }
  return fd;
}

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const uint16_t port = fd < 0 ? 0 : bind_loopback(fd);
  if (fd >= 0) ::close(fd);
  return port;
}

uint16_t free_port_pair() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint16_t port = free_port();
    if (port != 0 && port < 65535 && port_is_free(uint16_t(port + 1))) return port;
  }
  return free_port();
}

}  // namespace moeserve::peers
