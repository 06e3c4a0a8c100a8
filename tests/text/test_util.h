#pragma once
// Shared helpers of the text tests: fixture paths and loading.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/tokenizer.h"

namespace moeserve::text::testing {

// The Qwen3 tokenizer that scripts/fetch-test-data.sh puts in .cache/ (11 MB, not committed).
inline const char* kQwen3Dir = ".cache/tokenizer-qwen3";

// The Qwen3.5 pre-tokenizer regex (adds \p{M}); swapped into the Qwen3 file to test the second variant.
inline const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string qwen3_tokenizer_path() {
  std::string path = std::string(kQwen3Dir) + "/tokenizer.json";
  if (!std::filesystem::exists(path))
    throw std::runtime_error(path + " is missing: run scripts/fetch-test-data.sh first");
  return path;
}

// Loaded once per test binary: parsing 11 MB of JSON takes a moment.
inline const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_file(qwen3_tokenizer_path());
  return t;
}

inline const Tokenizer& qwen35_regex() {
  static const Tokenizer t = [] {
    auto j = nlohmann::json::parse(read_text(qwen3_tokenizer_path()));
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen35Regex;
    return Tokenizer::from_json(j.dump(), "qwen3.5-regex tokenizer.json");
  }();
  return t;
}

}  // namespace moeserve::text::testing
