#pragma once
// A compiled PCRE2 pattern (UTF + UCP, JIT when available) with the matching semantics of the Oniguruma
// regexes that Hugging Face tokenizers use. Shareable between threads.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace moeserve::text {

class Regex {
 public:
  // Throws moeserve::Error with PCRE2's message and offset when the pattern does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match in subject starting at or after `start`; subject must be valid UTF-8.
  // Returns false when there is none; sets [begin, end) otherwise.
  bool find(std::string_view subject, size_t start, size_t& begin, size_t& end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

// Escapes a literal string for use in a pattern (tokenizer.json Split/Replace with a "String" pattern).
std::string regex_escape(std::string_view literal);

}  // namespace moeserve::text
