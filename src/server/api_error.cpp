#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace moeserve::server {

std::string ApiError::bounded_message(std::string message) {
  if (message.size() <= kMaxMessageBytes) return message;
  size_t cut = kMaxMessageBytes;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  message.resize(cut);
  return message + "... (cut)";
}

std::string error_type_for_status(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 431: return "request_too_large";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_json(const ApiError& e) {
  nlohmann::json error = {{"message", e.what()},
                          {"type", e.type},
                          {"param", e.param ? nlohmann::json(*e.param) : nlohmann::json(nullptr)},
                          {"code", e.code ? nlohmann::json(*e.code) : nlohmann::json(e.status)}};
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status;
  r.body = error_json(e);
  if (e.retry_after_s) r.headers.emplace_back("Retry-After", std::to_string(*e.retry_after_s));
  return r;
}

HttpResponse error_response(int status, const std::string& message) {
  return error_response(ApiError(status, message, error_type_for_status(status)));
}

}  // namespace moeserve::server
