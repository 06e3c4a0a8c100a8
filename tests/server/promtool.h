#pragma once
// Lints Prometheus exposition text with the real promtool (Debian package prometheus).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "run_process.h"

namespace moeserve::server {

// Runs `promtool check metrics` on text; returns its exit code and output.
inline std::pair<int, std::string> promtool_check(const std::string& text) {
  // ctest runs test cases in parallel processes: one file per process.
  std::string path = testing::TempDir() + "metrics-" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << text;
  peers::CommandResult r = peers::run_command("promtool check metrics < " + path);
  return {r.status, r.output};
}

// Problems promtool reports, minus its naming lint against ':' — the `moeserve:` prefix follows vLLM
// (`vllm:`) and SGLang (`sglang:`), which promtool flags the same way. Parse errors and every other lint
// (counter suffixes, units, duplicate or missing HELP/TYPE) remain.
inline std::vector<std::string> promtool_problems(const std::string& text) {
  auto [rc, out] = promtool_check(text);
  std::vector<std::string> problems;
  if (rc == 0) return problems;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line.find("metric names should not contain ':'") != std::string::npos) continue;
    problems.push_back(line);
  }
  if (problems.empty() && out.empty()) problems.push_back("promtool failed with rc " + std::to_string(rc));
  return problems;
}

inline bool have_promtool() {
  return std::system("command -v promtool >/dev/null 2>&1") == 0;
}

}  // namespace moeserve::server
