#include "server/demo_model.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "common/error.h"

namespace moeserve::server {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRelative = ".cache/tokenizer-qwen3";
constexpr int kParentLevels = 3;

}  // namespace

std::vector<std::string> demo_tokenizer_candidates() {
  if (const char* env = std::getenv(kDemoTokenizerEnv); env && *env) return {env};
  std::vector<std::string> dirs;
  auto add = [&](const fs::path& p) {
    std::string s = p.lexically_normal().string();
    if (std::find(dirs.begin(), dirs.end(), s) == dirs.end()) dirs.push_back(s);
  };
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  add(ec ? fs::path(kRelative) : cwd / kRelative);
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (int level = 0; level <= kParentLevels && !dir.empty(); ++level) {
      add(dir / kRelative);
      if (dir == dir.root_path()) break;
      dir = dir.parent_path();
    }
  }
  return dirs;
}

std::string find_demo_tokenizer() {
  std::vector<std::string> dirs = demo_tokenizer_candidates();
  std::string looked;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (fs::is_regular_file(fs::path(d) / "tokenizer.json", ec)) return d;
    looked += "\n  " + d;
  }
  fail(
      "--model demo needs the Qwen3 tokenizer (tokenizer.json); looked in:{}\nrun scripts/fetch-test-data.sh "
      "in "
      "the checkout, set {}=DIR, or pass --tokenizer DIR",
      looked, kDemoTokenizerEnv);
}

}  // namespace moeserve::server
