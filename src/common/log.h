#pragma once
// Logging goes through spdlog's default logger (stderr). One call sets the level from a flag.

#include <spdlog/spdlog.h>

#include <string_view>

namespace moeserve {

// Accepts trace|debug|info|warn|error|off; throws moeserve::Error on anything else.
void set_log_level(std::string_view level);

}  // namespace moeserve
