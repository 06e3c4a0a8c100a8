#pragma once
// The request pieces the engine suites share: greedy sampling, random prompts, a conversation's next prompt.

#include <cstdint>
#include <random>
#include <vector>

#include "engine/engine.h"

namespace moeserve::engine_test {

// Temperature 0, exactly max_tokens tokens (eos ignored), and the top_logprobs alternatives of each step when
// asked for.
inline SamplingParams greedy(int max_tokens, int top_logprobs = 0) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = top_logprobs > 0;
  p.top_logprobs = top_logprobs;
  return p;
}

// n tokens drawn uniformly from [lowest, vocab).
inline std::vector<int32_t> random_prompt(std::mt19937& rng, int n, int vocab, int lowest = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = std::uniform_int_distribution<int>(lowest, vocab - 1)(rng);
  return t;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace moeserve::engine_test
