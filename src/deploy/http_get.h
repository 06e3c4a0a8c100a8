#pragma once
// A tiny blocking HTTP/1.1 GET for loopback status checks (/health, /metrics) of the local cluster. Not a
// general client: no TLS, no redirects; chunked bodies are decoded.

#include <string>

namespace moeserve::deploy {

struct HttpResponse {
  int status = 0;  // 0: no answer (refused, reset, timed out)
  std::string body;
  std::string error;
};

HttpResponse http_get(const std::string& host, int port, const std::string& path,
                      double timeout_seconds = 2.0);

}  // namespace moeserve::deploy
