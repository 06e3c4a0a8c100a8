#pragma once
// Field access for the request translators (responses_api.cpp, messages_api.cpp), which read another API's
// body before parse_chat_request validates the chat request it becomes.

#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"

namespace moeserve::server {

// The value of `key`, or null when absent or JSON null (as OpenAI and Anthropic treat an explicit null).
inline const nlohmann::ordered_json* present(const nlohmann::ordered_json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// A string field a request must carry; ApiError 400 naming `param` otherwise.
inline std::string required_string(const nlohmann::ordered_json& object, const char* key,
                                   const std::string& param) {
  const nlohmann::ordered_json* v = present(object, key);
  if (!v || !v->is_string()) throw invalid_param(param, "must be a string");
  return v->get<std::string>();
}

}  // namespace moeserve::server
