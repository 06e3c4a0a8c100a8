#include "text/detokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

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

// The filter's rule written the obvious (quadratic) way, for the differential test below.
struct NaiveStopFilter {
  std::vector<std::string> stops;
  std::string held{}, matched{};
  bool stopped = false;
  std::string push(const std::string& delta) {
    if (stopped) return "";
    held += delta;
    size_t best = std::string::npos;
    for (const auto& s : stops) {
      size_t at = held.find(s);
      if (at != std::string::npos && (at < best || (at == best && s.size() > matched.size()))) {
        best = at;
        matched = s;
      }
    }
    if (best != std::string::npos) {
      stopped = true;
      return held.substr(0, best);
    }
    size_t keep = 0;
    for (const auto& s : stops) {
      for (size_t len = std::min(s.size() - 1, held.size()); len > keep; --len) {
        if (held.compare(held.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
    std::string out = held.substr(0, held.size() - keep);
    held.erase(0, held.size() - keep);
    return out;
  }
};

TEST(StopStringFilter, AgreesWithTheNaiveRuleOnRandomStreams) {
  std::mt19937 rng(7);
  auto word = [&](size_t max_len) {
    std::string w(1 + rng() % max_len, 'a');
    for (char& c : w) c = static_cast<char>('a' + rng() % 3);  // a small alphabet: many partial matches
    return w;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (size_t i = 0, n = 1 + rng() % 3; i < n; ++i) stops.push_back(word(6));
    StopStringFilter fast(stops);
    NaiveStopFilter naive{stops};
    for (int d = 0; d < 12 && !naive.stopped; ++d) {
      std::string delta = word(4);
      ASSERT_EQ(fast.push(delta), naive.push(delta)) << "trial " << trial;
      ASSERT_EQ(fast.stopped(), naive.stopped);
    }
    if (naive.stopped) {
      EXPECT_EQ(fast.matched(), naive.matched);
    }
  }
}

TEST(StopStringFilter, LongRepetitiveStopIsMatchedAndHeldExactly) {
  // A 100,000-byte stop of 'a's ending in 'b', against a stream of 'a's: every byte is a possible start, so
  // everything is held, and the stop completes only with the 'b'.
  const std::string stop = std::string(100'000, 'a') + "b";
  StopStringFilter f({stop});
  std::string emitted;
  for (int i = 0; i < 200; ++i) emitted += f.push(std::string(1000, 'a'));
  EXPECT_EQ(emitted.size(), 200'000u - 100'000u);  // only what can no longer start the stop
  emitted += f.push("b tail");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(emitted, std::string(100'000, 'a'));
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
