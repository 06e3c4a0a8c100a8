#pragma once
// Seeded prompts of an exact token length. With a token counter (the model's tokenizer) every prompt is
// checked and adjusted until it encodes to exactly the requested number of tokens; without one, a prompt
// of N "tokens" is N common English words and full stops, which most BPE vocabularies encode as about N
// tokens. The same (seed, stream) always gives the same text, so runs are repeatable and comparable.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::loadgen {

using TokenCounter = std::function<size_t(std::string_view)>;

// Counts tokens with a Hugging Face tokenizer.json (`path` is the file or the folder holding it); the count
// is of the text alone, without special tokens. Throws moeserve::Error when the file is missing or
// unsupported.
TokenCounter load_token_counter(const std::string& path);

class PromptGenerator {
 public:
  explicit PromptGenerator(uint64_t seed, TokenCounter counter = {});

  // True when lengths are exact (a tokenizer was given).
  bool exact() const { return static_cast<bool>(counter_); }

  // A text of `tokens` tokens from the independent sequence `stream` (e.g. a request or turn index).
  std::string text(size_t tokens, uint64_t stream) const;

  // Tokens in `text` under the counter (words and full stops without one).
  size_t count(std::string_view text) const;

 private:
  uint64_t seed_;
  TokenCounter counter_;
  std::vector<std::string> words_;  // each one token, both alone and after a space
};

}  // namespace moeserve::loadgen
