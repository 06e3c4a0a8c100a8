#include "common/log.h"

#include "common/error.h"

namespace moeserve {

void set_log_level(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  check(parsed != spdlog::level::off || level == "off",
        "unknown log level '{}' (use trace, debug, info, warn, error or off)", level);
  spdlog::set_level(parsed);
}

}  // namespace moeserve
