// Replays the fuzzer's corpus (tests/fuzz/corpus) through the safetensors parser in the normal build: every
// input must parse, with views inside the input, or fail with moeserve::Error; nothing else.
#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "test_util.h"

namespace moeserve {
namespace {

using namespace moeserve::testing;

TEST(SafetensorsFuzzCorpus, EveryInputParsesOrFailsWithACleanError) {
  size_t parsed = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator("tests/fuzz/corpus")) {
    auto bytes = read_bytes(entry.path().string());
    try {
      auto header = parse_safetensors(bytes, entry.path().string());
      for (const auto& t : header.tensors) {
        EXPECT_GE(t.data, bytes.data() + 8) << entry.path() << " " << t.name;
        EXPECT_LE(t.data + t.nbytes, bytes.data() + bytes.size()) << entry.path() << " " << t.name;
      }
      ++parsed;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(entry.path().string()), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GE(parsed, 4u);
  EXPECT_GE(refused, 1u);
}

}  // namespace
}  // namespace moeserve
