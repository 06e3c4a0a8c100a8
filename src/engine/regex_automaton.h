#pragma once
// Regular expressions for structured output (JSON Schema `pattern` and `format`, vLLM's guided_regex,
// SGLang's regex), compiled once to a DFA over Unicode code points that the JSON matcher steps one character
// at a time. The language is ECMAScript's (what JSON Schema specifies and ajv runs, with the u flag) minus
// what no finite automaton can do: lookaround, backreferences and word boundaries are refused by name, never
// approximated, so a match here is a match there and the other way round.
//
// Anchors: `^` holds only before the first character and `$` only after the last (no multiline mode).
// A search pattern (JSON Schema's `pattern`) matches when it matches anywhere in the text; a full pattern
// (guided_regex) must match the whole text.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace moeserve {

class RegexDfa {
 public:
  static constexpr uint32_t kDead = 0xFFFFFFFF;
  static constexpr uint32_t kMaxCodePoint = 0x10FFFF;

  // Throws Error naming what is not supported or malformed, or when the DFA would pass max_states.
  // Lookaheads are taken where a search pattern starts with them right after `^` (zod writes email so:
  // ^(?!\.)(?!.*\.\.)...): each is then the intersection with (or without) the texts it matches a prefix of.
  static std::shared_ptr<const RegexDfa> compile(std::string_view pattern, bool search,
                                                 size_t max_states = 4096);
  // The texts both accept (or that `a` accepts and `b` does not, with `without`).
  static std::shared_ptr<const RegexDfa> intersect(const RegexDfa& a, const RegexDfa& b, bool without,
                                                   size_t max_states);

  uint32_t start() const { return 0; }
  size_t size() const { return states_.size(); }
  // The state after code point `cp`; kDead when no match can follow.
  uint32_t next(uint32_t state, uint32_t cp) const;
  bool accepting(uint32_t state) const { return states_[state].accepting; }
  // An accepting state can still be reached.
  bool live(uint32_t state) const { return states_[state].live; }

  // The transitions of a state, sorted by code point and disjoint.
  struct Edge {
    uint32_t lo, hi, target;
  };
  const std::vector<Edge>& edges(uint32_t state) const { return states_[state].edges; }

 private:
  struct State {
    std::vector<Edge> edges;
    bool accepting = false;
    bool live = false;
  };
  friend class RegexDfaBuilder;
  static void mark_live(RegexDfa& dfa);
  std::vector<State> states_;
};

}  // namespace moeserve
