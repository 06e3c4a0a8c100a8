// Replays each fuzz target's corpus (tests/fuzz/corpus/<target>/: seeds, the attack classes of issue 15, and
// the reproducer of every finding) in the normal build, so a regression fails CI without clang. Each target
// checks its own promises (fuzz_target.h); here every input must keep them, and each corpus must reach both
// outcomes, so that it exercises the accepting paths as well as the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "fuzz_target.h"

namespace moeserve::fuzz {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void replay(const std::string& target, Verdict (*run)(std::string_view)) {
  const fs::path dir = fs::path("tests/fuzz/corpus") / target;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::vector<fs::path> inputs;
  for (const auto& entry : fs::directory_iterator(dir)) inputs.push_back(entry.path());
  std::sort(inputs.begin(), inputs.end());
  size_t accepted = 0, refused = 0;
  for (const auto& path : inputs) {
    // A crash ends the process; the last line printed names the input that caused it.
    std::cout << "replaying " << path.string() << std::endl;
    try {
      (run(read_file(path)) == Verdict::kAccepted ? accepted : refused)++;
    } catch (const std::exception& e) {
      ADD_FAILURE() << path.string() << ": " << e.what();
    }
  }
  EXPECT_GE(accepted, 1u) << target << ": no input of the corpus is accepted";
  EXPECT_GE(refused, 1u) << target << ": no input of the corpus is refused";
}

TEST(FuzzCorpus, SafetensorsHeadersParseInsideTheFileOrFailNamingIt) {
  replay("safetensors", fuzz_safetensors);
}

TEST(FuzzCorpus, BoundedJsonEqualsNlohmannWithinTheLimitsAndRefusesBeyondThem) {
  replay("bounded_json", fuzz_bounded_json);
}

TEST(FuzzCorpus, OpenAiRequestsParseOrFailWithAShort400) {
  replay("openai_request", fuzz_openai_request);
}

TEST(FuzzCorpus, JsonSchemasCompileOrFailAndTheirMatchersNeverReachADeadEnd) {
  replay("json_schema", fuzz_json_schema);
}

TEST(FuzzCorpus, RouterReadsAnyBodyMetricsPageOrRetryAfterWithoutThrowing) {
  replay("router_request", fuzz_router_request);
}

TEST(FuzzCorpus, TokenizerEncodesAnyBytesAndDecodesAnyIds) {
  replay("tokenizer", fuzz_tokenizer);
}

TEST(FuzzCorpus, ModelConfigsLoadConsistentOrFailWithAnError) {
  replay("model_config", fuzz_model_config);
}

TEST(FuzzCorpus, ModelOutputParsesTheSameStreamedAsWholeWithoutThrowing) {
  replay("output_parser", fuzz_output_parser);
}

}  // namespace
}  // namespace moeserve::fuzz
