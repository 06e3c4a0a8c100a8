#include "text/detokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "text/utf8.h"

namespace moeserve::text {
namespace {

using testing::qwen3;

// Streams ids through the detokenizer; every delta must be valid UTF-8.
std::string stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special,
                   std::vector<std::string>* deltas = nullptr) {
  IncrementalDetokenizer d(t, skip_special);
  std::string all;
  for (int32_t id : ids) {
    std::string delta = d.push(id);
    EXPECT_TRUE(is_valid_utf8(delta)) << "delta for id " << id;
    all += delta;
    if (deltas) deltas->push_back(delta);
  }
  all += d.finish();
  return all;
}

TEST(IncrementalDetokenizer, ConcatenatedDeltasEqualFullDecodeOnGoldenTexts) {
  auto goldens = nlohmann::json::parse(testing::read_text("tests/fixtures/goldens/tokenizer-goldens.json"));
  for (const auto& c : goldens["qwen3"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(stream(qwen3(), ids, false), qwen3().decode(ids, false)) << c["text"];
    EXPECT_EQ(stream(qwen3(), ids, true), qwen3().decode(ids, true)) << c["text"];
  }
}

TEST(IncrementalDetokenizer, HoldsBytesOfASplitCharacterUntilComplete) {
  // U+1D11E is four bytes spread over several byte-level tokens.
  auto ids = qwen3().encode("a\xF0\x9D\x84\x9E!");
  std::vector<std::string> deltas;
  std::string all = stream(qwen3(), ids, true, &deltas);
  EXPECT_EQ(all, "a\xF0\x9D\x84\x9E!");
  size_t empty = std::count(deltas.begin(), deltas.end(), "");
  EXPECT_GE(empty, 1u);  // at least one token produced nothing while the character was incomplete
}

TEST(IncrementalDetokenizer, IncompleteCharacterAtEndBecomesReplacementCharacter) {
  auto ids = qwen3().encode("\xF0\x9D\x84\x9E");
  ids.pop_back();
  IncrementalDetokenizer d(qwen3());
  std::string all;
  for (int32_t id : ids) all += d.push(id);
  EXPECT_EQ(all, "");
  EXPECT_EQ(d.finish(), qwen3().decode(ids));
  EXPECT_EQ(qwen3().decode(ids), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, GarbageThenValidTextMatchesLossyDecode) {
  // A lead byte followed by ASCII can never complete: it becomes U+FFFD as soon as the ASCII arrives.
  std::vector<int32_t> ids = {*qwen3().token_id("\xC3\xA6"), *qwen3().token_id("a")};  // "æ" is byte 0xE6
  EXPECT_EQ(stream(qwen3(), ids, true), qwen3().decode(ids));
}

TEST(IncrementalDetokenizer, SpecialTokensAreSkippedOrEmittedWhole) {
  auto ids = qwen3().encode("hi<|im_end|>");
  std::vector<std::string> deltas;
  EXPECT_EQ(stream(qwen3(), ids, false, &deltas), "hi<|im_end|>");
  EXPECT_EQ(deltas.back(), "<|im_end|>");
  EXPECT_EQ(stream(qwen3(), ids, true), "hi");
}

std::string filter_all(StopStringFilter& f, const std::vector<std::string>& deltas,
                       std::vector<std::string>* out = nullptr) {
  std::string all;
  for (const auto& d : deltas) {
    std::string o = f.push(d);
    if (out) out->push_back(o);
    all += o;
  }
  return all + f.finish();
}

TEST(StopStringFilter, StopSplitAcrossDeltasIsNotEmitted) {
  StopStringFilter f({"STOP"});
  std::vector<std::string> emitted;
  EXPECT_EQ(filter_all(f, {"abc S", "T", "OP and more"}, &emitted), "abc ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.matched(), "STOP");
  EXPECT_EQ(emitted[0], "abc ");  // "S" was held back as a possible start of STOP
  EXPECT_EQ(f.push("later"), "");
}

TEST(StopStringFilter, HeldTextIsReleasedWhenTheStopDoesNotComplete) {
  StopStringFilter f({"STOP"});
  std::vector<std::string> emitted;
  EXPECT_EQ(filter_all(f, {"ST", "ORM ", "ST"}, &emitted), "STORM ST");
  EXPECT_EQ(emitted[0], "");
  EXPECT_EQ(emitted[1], "STORM ");
  EXPECT_FALSE(f.stopped());
}

TEST(StopStringFilter, EarliestStopWinsAndNoStopsPassesThrough) {
  StopStringFilter f({"world", "lo w"});
  EXPECT_EQ(filter_all(f, {"hello world"}), "hel");
  EXPECT_EQ(f.matched(), "lo w");
  StopStringFilter none({});
  EXPECT_EQ(filter_all(none, {"a", "b"}), "ab");
}

TEST(StopStringFilter, StopsOnRealTokenStreamWithMultibyteStop) {
  std::string text = "答案是：四十二。结束了吗";
  auto ids = qwen3().encode(text);
  IncrementalDetokenizer d(qwen3());
  StopStringFilter f({"。结束"});
  std::string out;
  for (int32_t id : ids) {
    out += f.push(d.push(id));
    if (f.stopped()) break;
  }
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(out, "答案是：四十二");
}

}  // namespace
}  // namespace moeserve::text
