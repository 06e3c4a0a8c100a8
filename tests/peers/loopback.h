#pragma once
// Loopback sockets for the test suites' own peers: one way to listen on 127.0.0.1 and to find a free port.

#include <cstdint>

namespace moeserve::peers {

// A socket listening on 127.0.0.1 at a port the kernel picks (returned in `port`), SO_REUSEADDR set.
// Throws std::runtime_error naming the failure.
int listen_loopback(uint16_t& port, int backlog = 512);

// A loopback port nobody listens on right now (bound and released: good enough for a test's own listeners).
uint16_t free_port();

// A port p such that p and p + 1 are both free right now (for a command that numbers its servers from a base
// port); falls back to free_port() when no such pair turns up in a few tries.
uint16_t free_port_pair();

}  // namespace moeserve::peers
