#pragma once
// Loopback sockets for the test suites' own peers: one way to listen on 127.0.0.1 and to find a free port.

#include <cstdint>

namespace moeserve::peers {

// A socket listening on 127.0.0.1 at a port the kernel picks (returned in `port`), SO_REUSEADDR set.
// Throws std::runtime_error naming the failure.
int listen_loopback(uint16_t& port, int backlog = 512);

// A loopback port nobody listens on right now (bound and released: good enough for a test's own listeners).
uint16_t free_port();

}  // namespace moeserve::peers
