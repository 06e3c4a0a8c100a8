#pragma once
// OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the HTTP status clients expect.
// Request handling throws ApiError; the service turns it into a response at its boundary.

#include <fmt/format.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "server/http.h"

namespace moeserve::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt)
      : std::runtime_error(bounded_message(std::move(message))),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}

  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;
  std::optional<int> retry_after_s;  // sent as Retry-After (429/503)

  // Messages quote the request (a role, a key, a tool name): cut, so that an error never echoes a large part
  // of it back, whatever the rule that produced it.
  static constexpr size_t kMaxMessageBytes = 512;
  static std::string bounded_message(std::string message);
};

// 400 naming the offending parameter, e.g. invalid_param("temperature", "must be in [0, 2], got {}", t).
template <typename... Args>
ApiError invalid_param(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  return ApiError(400, fmt::format("'{}': {}", param, fmt::format(format, std::forward<Args>(args)...)),
                  "invalid_request_error", param);
}

// The reason phrase-like error type for a status, as OpenAI and vLLM use them.
std::string error_type_for_status(int status);

std::string error_json(const ApiError& e);
HttpResponse error_response(const ApiError& e);
HttpResponse error_response(int status, const std::string& message);

}  // namespace moeserve::server
