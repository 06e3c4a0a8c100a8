#pragma once
// Sizes and durations as operators write them in cluster.yaml and on command lines.

#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::deploy {

// "128GB" (decimal, 1e9), "119GiB" (binary), "64g"/"64G"/"512m" (binary, like docker --shm-size), plain
// bytes. Throws moeserve::Error naming `what` on malformed input.
uint64_t parse_bytes(std::string_view text, std::string_view what);

// "30s", "5m", "1h", "500ms", or a plain number of seconds. Returns seconds (fractions kept).
double parse_seconds(std::string_view text, std::string_view what);

// 35_800_000_000 -> "35.8 GB" (decimal units: what GPU and Spark data sheets use).
std::string format_bytes(double bytes);

// ASCII letters in lower case (units, GPU names and architectures compare case-insensitively).
std::string ascii_lower(std::string_view s);

// 300 -> "300s", 90 -> "90s" (the form nginx and Prometheus accept).
std::string format_seconds(double seconds);

}  // namespace moeserve::deploy
