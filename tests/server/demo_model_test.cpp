// Where `serve --model demo` looks for its tokenizer: the environment variable, then the working directory,
// then the binary's directory and its parents; a miss names every place it looked.
#include "server/demo_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/error.h"

namespace moeserve::server {
namespace {

namespace fs = std::filesystem;

class DemoTokenizer : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv(kDemoTokenizerEnv); }
};

TEST_F(DemoTokenizer, LooksInTheWorkingDirectoryThenBesideTheBinary) {
  unsetenv(kDemoTokenizerEnv);
  auto dirs = demo_tokenizer_candidates();
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], (fs::current_path() / ".cache/tokenizer-qwen3").lexically_normal().string());
  // This test binary sits in build/tests/server: two levels up is build/, three the checkout.
  fs::path exe_dir = fs::read_symlink("/proc/self/exe").parent_path();
  EXPECT_EQ(dirs[1], (exe_dir / ".cache/tokenizer-qwen3").lexically_normal().string());
  EXPECT_NE(std::find(dirs.begin(), dirs.end(),
                      (exe_dir.parent_path().parent_path().parent_path() / ".cache/tokenizer-qwen3").string()),
            dirs.end());
  // Tests run from the checkout, where scripts/fetch-test-data.sh put it.
  EXPECT_EQ(find_demo_tokenizer(), dirs[0]);
}

TEST_F(DemoTokenizer, TheEnvironmentVariableDecidesAlone) {
  setenv(kDemoTokenizerEnv, ".cache/tokenizer-qwen3", 1);
  EXPECT_EQ(demo_tokenizer_candidates(), std::vector<std::string>{".cache/tokenizer-qwen3"});
  EXPECT_EQ(find_demo_tokenizer(), ".cache/tokenizer-qwen3");
  setenv(kDemoTokenizerEnv, "/nonexistent/qwen3", 1);
  try {
    find_demo_tokenizer();
    FAIL() << "no error for a directory without tokenizer.json";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/qwen3"), std::string::npos) << m;
    EXPECT_NE(m.find(kDemoTokenizerEnv), std::string::npos) << m;
    EXPECT_NE(m.find("--tokenizer"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace moeserve::server
