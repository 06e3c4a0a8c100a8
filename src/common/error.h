#pragma once
// Errors are exceptions carrying a message a person can act on: what was wrong and where.
// Library code throws moeserve::Error; the CLI and the server catch it at their boundary.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moeserve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// check(cond, "...") — for conditions that depend on input (files, flags, requests), never on our own bugs.
template <typename... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) fail(format, std::forward<Args>(args)...);
}

}  // namespace moeserve
