#include "text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_util.h"
#include "text/detokenizer.h"
#include "text/utf8.h"

namespace moeserve::text {
namespace {

using testing::qwen3;
using testing::qwen35_regex;
using testing::read_text;

void check_goldens(const Tokenizer& tok, const char* key) {
  auto goldens = nlohmann::json::parse(read_text("tests/fixtures/goldens/tokenizer-goldens.json"));
  ASSERT_GT(goldens[key].size(), 10u);
  for (const auto& c : goldens[key]) {
    std::string text = c["text"];
    auto expected = c["ids"].get<std::vector<int32_t>>();
    auto ids = tok.encode(text);
    EXPECT_EQ(ids, expected) << key << ": " << text;
    EXPECT_EQ(tok.decode(expected), c["decoded"].get<std::string>()) << key << ": " << text;
  }
}

TEST(Tokenizer, Qwen3MatchesHuggingFaceGoldens) {
  check_goldens(qwen3(), "qwen3");
}
TEST(Tokenizer, Qwen35RegexMatchesHuggingFaceGoldens) {
  check_goldens(qwen35_regex(), "qwen35_regex");
}

TEST(Tokenizer, SpecialTokenIdsAndFlags) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_id("<think>"), 151667);
  EXPECT_EQ(t.token_id("Hello"), 9707);
  EXPECT_FALSE(t.token_id("definitely-not-a-token").has_value());
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_TRUE(t.is_added(151667));
  EXPECT_FALSE(t.is_added(9707));
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.id_to_token(220), "Ġ");
}

TEST(Tokenizer, DecodeSkipsSpecialTokensOnlyWhenAsked) {
  const Tokenizer& t = qwen3();
  auto ids = t.encode("<|im_start|>user\nhi<|im_end|><think>x</think>");
  EXPECT_EQ(t.decode(ids, true), "user\nhi<think>x</think>");
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>user\nhi<|im_end|><think>x</think>");
}

TEST(Tokenizer, DecodeReplacesBrokenUtf8LikeHuggingFace) {
  const Tokenizer& t = qwen3();
  auto ids = t.encode("\xF0\x9D\x84\x9E");  // U+1D11E: one character, several byte tokens
  ASSERT_GT(ids.size(), 1u);
  std::vector<int32_t> first_only(ids.begin(), ids.begin() + 1);
  EXPECT_EQ(t.decode(first_only), "\xEF\xBF\xBD");
  EXPECT_THROW(t.decode(std::vector<int32_t>{-1}), Error);
}

TEST(Tokenizer, IdsPastTheVocabularyHaveNoText) {
  // The embedding table is padded past the tokenizer; a sampled padding id decodes to nothing, as in HF.
  const Tokenizer& t = qwen3();
  auto ids = t.encode("hi there");
  std::vector<int32_t> padded = ids;
  padded.insert(padded.begin() + 1, int32_t(t.vocab_size()) + 26);
  EXPECT_EQ(t.decode(padded), t.decode(ids));
  EXPECT_EQ(t.token_bytes(int32_t(t.vocab_size())), "");
}

TEST(Tokenizer, EmptyInputGivesNoTokens) {
  EXPECT_TRUE(qwen3().encode("").empty());
  EXPECT_EQ(qwen3().decode(std::vector<int32_t>{}), "");
}

TEST(Tokenizer, InvalidUtf8IsEncodedAsReplacementCharacters) {
  const Tokenizer& t = qwen3();
  std::string bad = "ok \xFF\xC3 end \xE9\x9B";
  auto ids = t.encode(bad);
  EXPECT_EQ(ids, t.encode(utf8_lossy(bad)));
  EXPECT_EQ(t.decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD end \xEF\xBF\xBD");
}

TEST(Tokenizer, MegabyteOfOneCharacterRoundTrips) {
  // Each input is one huge pre-token (or one regex run): a quadratic merge or regex would not finish.
  for (std::string unit : {"a", " ", "1", "!", "\n", "集", "é"}) {
    std::string text;
    while (text.size() < (1u << 20)) text += unit;
    auto ids = qwen3().encode(text);
    ASSERT_FALSE(ids.empty());
    EXPECT_LE(ids.size(), text.size());
    EXPECT_EQ(qwen3().decode(ids), text) << "unit '" << unit << "'";
  }
}

TEST(Tokenizer, BatchEncodeEqualsSequentialEncode) {
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("item " + std::to_string(i) + " 你好 <|im_end|> x" + std::string(i, 'z'));
  auto batch = qwen3().encode_batch(texts);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], qwen3().encode(texts[i]));
}

TEST(Tokenizer, NfcNormalizesCombiningSequences) {
  // "e" + U+0301 is NFC-normalized to "é" before splitting, so both spellings encode the same.
  EXPECT_EQ(qwen3().encode("cafe\xCC\x81"), qwen3().encode("caf\xC3\xA9"));
}

TEST(Tokenizer, NfcLeavesCompatibilityCharactersAlone) {
  // The full-width comma has only a compatibility decomposition: NFC keeps it (NFKC would make it ',').
  std::string text = "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C";  // 你好，世界
  EXPECT_EQ(qwen3().decode(qwen3().encode(text)), text);
}

// ---- a tiny hand-made tokenizer.json, to exercise components the Qwen file does not use -------------

nlohmann::json tiny_tokenizer() {
  using nlohmann::json;
  json vocab = json::object();
  int id = 0;
  for (const char* t : {"a", "b", "c", "ab", "abc", "Ġ", "Ġab", "<unk>"}) vocab[t] = id++;
  json j = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}, {"invert", false}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"a b", json::array({"ab", "c"})})},
        {"unk_token", "<unk>"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       json::array({{{"id", 8}, {"content", "<s>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}}})},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({8})}}}}}}},
  };
  return j;
}

TEST(Tokenizer, HandMadeBpeAppliesRankedMergesUnknownAndTemplate) {
  Tokenizer t = Tokenizer::from_json(tiny_tokenizer().dump());
  // "abc" merges a+b then ab+c; "x" is unknown; the post-processor prepends <s> (id 8).
  EXPECT_EQ(t.encode("abc x"), (std::vector<int32_t>{8, 4, 7}));
  EXPECT_EQ(t.encode("abc x", false), (std::vector<int32_t>{4, 7}));
  // lstrip/rstrip: the spaces around <s> belong to it.
  EXPECT_EQ(t.encode("ab <s> c", false), (std::vector<int32_t>{3, 8, 2}));
}

TEST(Tokenizer, NfkcFoldsCompatibilityCharacters) {
  auto j = tiny_tokenizer();
  j["model"]["vocab"][","] = 9;
  j["normalizer"] = {{"type", "NFKC"}};
  Tokenizer t = Tokenizer::from_json(j.dump());
  EXPECT_EQ(t.encode("ab\xEF\xBC\x8C", false), (std::vector<int32_t>{3, 9}));  // "ab，" -> "ab,"
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("ab\xEF\xBC\x8C", false), (std::vector<int32_t>{3, 7}));
}

TEST(Tokenizer, DecomposingAndCompatibilityFormsChangeLatin1AndHangul) {
  auto j = tiny_tokenizer();
  j["model"]["vocab"]["A"] = 9;
  j["model"]["vocab"]["\u0300"] = 10;
  j["model"]["vocab"]["\u1100"] = 11;
  j["model"]["vocab"]["\u1161"] = 12;
  j["normalizer"] = {{"type", "NFD"}};
  Tokenizer nfd = Tokenizer::from_json(j.dump());
  EXPECT_EQ(nfd.encode("\u00C0", false), (std::vector<int32_t>{9, 10}));   // À -> A + grave
  EXPECT_EQ(nfd.encode("\uAC00", false), (std::vector<int32_t>{11, 12}));  // 가 -> ᄀ + ᅡ
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("\u00C0", false), (std::vector<int32_t>{7}));  // stays À
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("a\u00A0b", false), (std::vector<int32_t>{0, 1}));  // NBSP
}

// Llama/Mistral style: SentencePiece's "▁" for spaces, no ByteLevel, and characters missing from the
// vocabulary spelled as byte tokens "<0x00>".."<0xFF>".
nlohmann::json byte_fallback_tokenizer() {
  using nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (const char* t : {"\u2581", "a", "b", "\u2581a", "\u2581ab"}) vocab[t] = id++;  // 259..263
  return {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"\u2581 a", "\u2581a b"})},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
  };
}

TEST(Tokenizer, ByteFallbackSpellsUnknownCharactersAsBytesAndDecodesThemBack) {
  Tokenizer t = Tokenizer::from_json(byte_fallback_tokenizer().dump());
  auto byte = [](int b) { return 3 + b; };
  std::string text = "ab \u00e9\u4e2d";  // "ab é中": é and 中 are not in the vocabulary
  // "▁ab▁é中": ▁ab, ▁, then é's bytes C3 A9 and 中's bytes E4 B8 AD.
  std::vector<int32_t> expected = {263, 259, byte(0xC3), byte(0xA9), byte(0xE4), byte(0xB8), byte(0xAD)};
  EXPECT_EQ(t.encode(text), expected);
  EXPECT_EQ(t.decode(expected), text);  // Replace ▁ -> " ", bytes -> UTF-8, Strip drops the leading space
  EXPECT_EQ(t.id_to_token(byte(0xE4)), "<0xE4>");

  // A stream emits each character once all its bytes arrived; it keeps the leading space (a continuation).
  IncrementalDetokenizer stream(t);
  std::vector<std::string> deltas;
  for (int32_t id : expected) deltas.push_back(stream.push(id));
  EXPECT_EQ(deltas, (std::vector<std::string>{" ab", " ", "", "\u00e9", "", "", "\u4e2d"}));

  // Special tokens decode as their text unless skipped; a lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 263, 2}), "<s> ab</s>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 263, 2}, true), "ab");
  EXPECT_EQ(t.decode(std::vector<int32_t>{263, byte(0xB8)}), "ab\uFFFD");
  // As in tokenizers, a run of byte tokens that is not UTF-8 gives one U+FFFD per byte: here the two bytes
  // of an unfinished 中 (a maximal ill-formed subsequence, which utf8_lossy would make a single U+FFFD).
  EXPECT_EQ(t.decode(std::vector<int32_t>{byte(0xE4), byte(0xB8), 263}), "\uFFFD\uFFFD ab");
  EXPECT_EQ(t.decode(std::vector<int32_t>{byte(0xC3), byte(0xA9), 259, byte(0xE4), byte(0xB8)}),
            "\u00e9 \uFFFD\uFFFD");
}

TEST(Tokenizer, WithoutByteTokensUnknownCharactersFuseIntoOneUnk) {
  auto j = byte_fallback_tokenizer();
  j["model"]["byte_fallback"] = false;
  Tokenizer t = Tokenizer::from_json(j.dump());
  EXPECT_EQ(t.encode("ab \u00e9\u4e2d"), (std::vector<int32_t>{263, 259, 0}));  // é中 -> one <unk>
}

TEST(Tokenizer, MalformedFilesGiveErrorsThatSayWhat) {
  auto message = [](const std::string& text) {
    try {
      Tokenizer::from_json(text, "bad.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message("{not json"), ::testing::HasSubstr("bad.json: not valid JSON"));
  EXPECT_THAT(message("[]"), ::testing::HasSubstr("expected a JSON object"));
  EXPECT_THAT(message("{}"), ::testing::HasSubstr("missing field 'model'"));

  auto j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("model type 'WordPiece' is not supported"));
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("normalizer type 'BertNormalizer' is not supported"));
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("pre-tokenizer type 'Metaspace' is not supported"));
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("decoder type 'WordPiece' is not supported"));
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("Strip is supported only after Fuse"));
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "Replace"}, {"pattern", {{"Regex", "x+"}}}, {"content", " "}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("only a {\"String\": ...} pattern is supported"));
  j = tiny_tokenizer();
  j["model"]["merges"].push_back("a zz");
  EXPECT_THAT(message(j.dump()),
              ::testing::HasSubstr("merges[2]: ('a', 'zz') uses a token that is not in the vocabulary"));
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("does not compile"));
  j = tiny_tokenizer();
  j["model"]["vocab"]["a"] = "zero";
  EXPECT_THAT(message(j.dump()), ::testing::HasSubstr("vocab['a']: expected a non-negative integer id"));
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

}  // namespace
}  // namespace moeserve::text
