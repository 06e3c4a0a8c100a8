#pragma once
// What the router suites share beyond the peer library (tests/peers: the scripted FakeBackend, the HTTP
// client, child processes such as `moeserve route` or nginx, free ports): the reference nginx.conf and an SSE
// event as serve writes one.

#include <cstdint>
#include <string>
#include <vector>

#include "child_process.h"
#include "fake_backend.h"
#include "http_client.h"
#include "loopback.h"

namespace moeserve::router::testing {

// The peer library, in the namespace of the router suites.
using peers::BackendConnection;
using peers::ChildOptions;
using peers::ChildProcess;
using peers::FakeBackend;
using peers::free_port;
using peers::Gate;
using peers::http_request;
using peers::HttpClient;
using peers::HttpRequest;
using peers::HttpResponse;
using peers::wait_http_ok;
using peers::wait_listening;

// nginx.conf for the reference deployment's tuning (least_conn, max_fails=3 fail_timeout=30s, keepalive 32
// with a 300 s idle timeout, 300 s read/send timeouts, proxy_buffering off), one worker, everything under
// `dir`.
std::string nginx_reference_config(const std::string& dir, uint16_t port,
                                   const std::vector<std::string>& urls, bool least_conn = true);

// A minimal OpenAI-like chat completion in SSE, `pieces` deltas, for backends that just answer.
std::string sse_event(const std::string& content);

}  // namespace moeserve::router::testing
