#pragma once
// What a string must be beyond JSON: a length in code points (minLength/maxLength) and text an automaton
// accepts (pattern, format, or a whole-output regex), decided exactly while the string is written. A prefix
// of n characters that leaves the automaton in state q is accepted only while some k more characters reach an
// accepting state with minLength <= n + k <= maxLength, so the matcher never writes a string it cannot
// close, and closes only strings that pass.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/regex_automaton.h"

namespace moeserve {

class StringRule {
 public:
  // Throws Error when the table of lengths the automaton can still reach would pass max_table entries.
  StringRule(std::shared_ptr<const RegexDfa> dfa, int64_t min_length, int64_t max_length,
             size_t max_table = size_t{1} << 21);

  uint32_t start() const { return dfa_ ? dfa_->start() : 0; }
  // The state after one more character (RegexDfa::kDead when none can follow).
  uint32_t next(uint32_t state, uint32_t cp) const { return dfa_ ? dfa_->next(state, cp) : 0; }
  // `length` characters leaving `state` can still become a whole string that passes.
  bool viable(uint32_t state, int64_t length) const;
  // They are one.
  bool complete(uint32_t state, int64_t length) const;
  // Some code point in [lo, hi], written as the next character, keeps the string viable.
  bool any_viable(uint32_t state, int64_t length, uint32_t lo, uint32_t hi) const;

  const std::shared_ptr<const RegexDfa>& automaton() const { return dfa_; }
  int64_t min_length() const { return min_length_; }
  int64_t max_length() const { return max_length_; }

 private:
  static constexpr uint32_t kNever = 0xFFFFFFFF;
  std::shared_ptr<const RegexDfa> dfa_;  // null: any text
  int64_t min_length_, max_length_;      // max -1: none
  // With an automaton and lengths: for state q and k <= horizon_, the least k' >= k such that q reaches an
  // accepting state in exactly k' characters (kNever if none). With maxLength the horizon is maxLength;
  // without it, minLength + the number of states (a longer path to acceptance implies one in that window).
  int64_t horizon_ = 0;
  std::vector<uint32_t> next_length_;
};

// The automaton of a JSON Schema `format` (date-time, date, time, duration, uuid, email, uri, ipv4, ipv6,
// hostname), written to accept what ajv-formats accepts in its full mode; nullptr when the format is unknown.
std::shared_ptr<const RegexDfa> format_automaton(std::string_view format);

}  // namespace moeserve
