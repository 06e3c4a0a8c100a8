#include "deploy/units.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>

#include "common/error.h"

namespace moeserve::deploy {
namespace {

// Splits "12.5GiB" into 12.5 and "gib"; fails when there is no leading number.
std::pair<double, std::string> number_and_unit(std::string_view text, std::string_view what) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  size_t end = 0;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) ++end;
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + end, value);
  check(end > 0 && ec == std::errc() && ptr == s.data() + end,
        "{}: '{}' is not a number with an optional unit", what, text);
  return {value, ascii_lower(std::string_view(s).substr(end))};
}

}  // namespace

uint64_t parse_bytes(std::string_view text, std::string_view what) {
  auto [value, unit] = number_and_unit(text, what);
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else if (unit == "k" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    fail("{}: unknown size unit '{}' in '{}' (use GB, GiB, MB, MiB, g, m, ...)", what, unit, text);
  return uint64_t(std::llround(value * scale));
}

double parse_seconds(std::string_view text, std::string_view what) {
  auto [value, unit] = number_and_unit(text, what);
  if (unit.empty() || unit == "s") return value;
  if (unit == "ms") return value / 1000;
  if (unit == "m") return value * 60;
  if (unit == "h") return value * 3600;
  fail("{}: unknown time unit '{}' in '{}' (use ms, s, m or h)", what, unit, text);
}

std::string format_bytes(double bytes) {
  if (bytes >= 1e12) return fmt::format("{:.2f} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.1f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

std::string format_seconds(double seconds) {
  if (seconds == std::floor(seconds)) return fmt::format("{}s", int64_t(seconds));
  return fmt::format("{}ms", int64_t(std::llround(seconds * 1000)));
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace moeserve::deploy
