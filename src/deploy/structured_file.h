#pragma once
// cluster.yaml (or .json) -> nlohmann::json, so every reader of operator files walks one tree type and
// reports errors with the same field paths.

#include <nlohmann/json.hpp>
#include <string>

namespace moeserve::deploy {

// YAML (block or flow style) or JSON, chosen by content (JSON is YAML too, but nlohmann gives better errors).
// Plain YAML scalars become numbers/booleans/null when they read as such; quoted ones stay strings.
nlohmann::json parse_structured_text(const std::string& text, const std::string& source_name);
nlohmann::json load_structured_file(const std::string& path);

}  // namespace moeserve::deploy
