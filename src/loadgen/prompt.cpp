#include "loadgen/prompt.h"

#include <filesystem>

#include "common/error.h"
#include "text/tokenizer.h"

namespace moeserve::loadgen {
namespace {

// Common English words; with a tokenizer only those that are one token (with and without a leading space)
// are kept, so a prompt's length is its word count unless the tokenizer merges across words.
constexpr std::string_view kWords[] = {
    "the",       "of",         "and",        "to",          "in",        "is",       "that",       "for",
    "it",        "as",         "was",        "with",        "be",        "by",       "on",         "not",
    "he",        "this",       "are",        "or",          "his",       "from",     "at",         "which",
    "but",       "have",       "an",         "had",         "they",      "you",      "were",       "their",
    "one",       "all",        "we",         "can",         "her",       "has",      "there",      "been",
    "if",        "more",       "when",       "will",        "would",     "who",      "so",         "no",
    "she",       "other",      "its",        "may",         "these",     "about",    "them",       "than",
    "some",      "him",        "time",       "into",        "only",      "do",       "could",      "new",
    "any",       "my",         "two",        "first",       "then",      "out",      "what",       "now",
    "people",    "made",       "like",       "over",        "also",      "did",      "such",       "after",
    "most",      "many",       "before",     "must",        "through",   "years",    "where",      "much",
    "your",      "way",        "down",       "should",      "because",   "each",     "just",       "those",
    "how",       "too",        "little",     "state",       "good",      "very",     "make",       "world",
    "still",     "own",        "see",        "men",         "work",      "long",     "get",        "here",
    "between",   "both",       "life",       "being",       "under",     "never",    "day",        "same",
    "another",   "know",       "while",      "last",        "might",     "us",       "great",      "old",
    "year",      "off",        "come",       "since",       "against",   "go",       "came",       "right",
    "used",      "take",       "three",      "house",       "use",       "during",   "without",    "again",
    "place",     "around",     "however",    "home",        "small",     "found",    "thought",    "went",
    "say",       "part",       "once",       "general",     "high",      "upon",     "school",     "every",
    "does",      "got",        "united",     "left",        "number",    "course",   "war",        "until",
    "always",    "away",       "something",  "fact",        "though",    "water",    "less",       "public",
    "put",       "think",      "almost",     "hand",        "enough",    "far",      "took",       "head",
    "yet",       "government", "system",     "better",      "set",       "told",     "nothing",    "night",
    "end",       "why",        "called",     "eyes",        "find",      "going",    "look",       "asked",
    "later",     "knew",       "point",      "next",        "program",   "city",     "business",   "give",
    "group",     "toward",     "young",      "days",        "let",       "room",     "president",  "side",
    "social",    "given",      "present",    "order",       "national",  "second",   "rather",     "possible",
    "face",      "per",        "among",      "form",        "important", "often",    "things",     "looked",
    "early",     "white",      "case",       "john",        "become",    "large",    "big",        "need",
    "four",      "within",     "felt",       "along",       "children",  "saw",      "best",       "church",
    "ever",      "least",      "power",      "development", "light",     "thing",    "seemed",     "family",
    "interest",  "want",       "members",    "mind",        "country",   "area",     "others",     "done",
    "turned",    "although",   "open",       "god",         "service",   "problem",  "certain",    "kind",
    "different", "thus",       "began",      "door",        "help",      "means",    "sense",      "whole",
    "matter",    "perhaps",    "itself",     "york",        "times",     "law",      "human",      "line",
    "above",     "name",       "example",    "action",      "company",   "hands",    "local",      "show",
    "whether",   "five",       "history",    "gave",        "today",     "either",   "act",        "feet",
    "across",    "taken",      "past",       "quite",       "anything",  "seen",     "having",     "death",
    "week",      "experience", "body",       "word",        "half",      "really",   "field",      "car",
    "words",     "already",    "themselves", "information", "tell",      "together", "college",    "shall",
    "money",     "period",     "held",       "keep",        "sure",      "probably", "free",       "seems",
    "real",      "behind",     "cannot",     "miss",        "political", "air",      "question",   "making",
    "office",    "brought",    "whose",      "special",     "heard",     "major",    "problems",   "ago",
    "became",    "federal",    "study",      "available",   "known",     "result",   "street",     "economic",
    "boy",       "position",   "reason",     "change",      "south",     "board",    "individual", "job",
    "society",   "areas",      "west",       "close",       "turn",      "love",     "community",  "true",
    "court",     "force",      "full",
};

// splitmix64: a tiny, fully specified generator, so a seed gives the same prompts on every platform.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

// Appends one unit (a word, or a full stop ending a sentence) to `out`; each unit is one token.
void append_unit(std::string& out, const std::vector<std::string>& words, Rng& rng, size_t& sentence_len) {
  if (sentence_len >= 6 && rng.below(10) == 0) {
    out += '.';
    sentence_len = 0;
    return;
  }
  if (!out.empty()) out += ' ';
  out += words[rng.below(words.size())];
  ++sentence_len;
}

}  // namespace

TokenCounter load_token_counter(const std::string& path) {
  std::string file = std::filesystem::is_directory(path) ? path + "/tokenizer.json" : path;
  auto tokenizer = std::make_shared<text::Tokenizer>(text::Tokenizer::from_file(file));
  return
      [tokenizer](std::string_view t) { return tokenizer->encode(t, /*add_special_tokens=*/false).size(); };
}

PromptGenerator::PromptGenerator(uint64_t seed, TokenCounter counter)
    : seed_(seed), counter_(std::move(counter)) {
  for (std::string_view w : kWords) {
    std::string word(w);
    if (counter_ && (counter_(word) != 1 || counter_(" " + word) != 1)) continue;
    words_.push_back(std::move(word));
  }
  check(words_.size() >= 32, "the tokenizer encodes too few common English words as one token ({} of {})",
        words_.size(), std::size(kWords));
}

size_t PromptGenerator::count(std::string_view text) const {
  if (counter_) return counter_(text);
  size_t units = 0;
  bool in_word = false;
  for (char c : text) {
    if (c == '.') {
      ++units;
      in_word = false;
    } else if (c == ' ' || c == '\n' || c == '\t') {
      in_word = false;
    } else if (!in_word) {
      ++units;
      in_word = true;
    }
  }
  return units;
}

std::string PromptGenerator::text(size_t tokens, uint64_t stream) const {
  Rng rng{seed_ * 0x2545f4914f6cdd1dULL ^ (stream + 1) * 0x9e3779b97f4a7c15ULL};
  std::string out;
  out.reserve(tokens * 7);
  size_t sentence_len = 0;
  for (size_t i = 0; i < tokens; ++i) append_unit(out, words_, rng, sentence_len);
  if (!counter_) return out;
  // A tokenizer may merge across units now and then; top up with further words until the count is exact,
  // dropping a trailing word whenever it overshoots. Each round changes the count by at least one.
  size_t n = counter_(out);
  for (int round = 0; n != tokens && round < 256; ++round) {
    if (n < tokens) {
      append_unit(out, words_, rng, sentence_len);
    } else {
      size_t cut = out.find_last_of(" .");
      out.resize(cut == std::string::npos ? 0 : cut);
      sentence_len = 0;
    }
    n = counter_(out);
  }
  check(n == tokens,
        "could not build a prompt of exactly {} tokens (got {}); is the tokenizer byte-level BPE?", tokens,
        n);
  return out;
}

}  // namespace moeserve::loadgen
