#pragma once
// Sampler: turns one row of logits into the next token of one request, following that request's
// SamplingParams. Each request owns its sampler and its random stream, so a seeded request draws the same
// numbers whether it runs alone or in a batch of 100.
//
// Order (as Hugging Face's generate applies its processors): penalties on the raw logits (repetition over
// prompt + output, frequency and presence over the output) and the request's logit_bias, then greedy argmax
// if temperature is 0, else temperature, top-k, top-p, min-p, and a draw from what is left, renormalised.
//
// Every cut keeps a prefix of the tokens in sampling order (most likely first, ties: lower id first), and the
// draw walks that order too, so a row's leading candidates (LogitCandidates, reduced where the logits are)
// usually decide the token without the rest of the row: sample(candidates) gives the token sample(row) would,
// or says that it needs the row.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "model/qwen35.h"

namespace moeserve {

struct TokenProb {
  int32_t token = 0;
  float prob = 0.0f;
};

namespace sampling {
class RowView;
}

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed);

  // The filtered distribution, renormalised, in sampling order (one entry with prob 1 when greedy).
  // `banned` tokens (eos before min_tokens) get probability 0; if everything is banned they are ignored.
  std::vector<TokenProb> distribution(std::span<const float> logits, std::span<const int32_t> banned);
  // Draws the next token and records it for the penalties.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> banned);
  // The same token from the row's leading candidates when they decide it; nullopt when they do not
  // (penalties, a cut or a draw past the last candidate, a ban where the row's total mass matters). Then the
  // caller passes the full row to sample(), which reuses the random number this call drew.
  std::optional<int32_t> sample(const LogitCandidates& row, std::span<const int32_t> banned);
  // Records a token produced elsewhere (e.g. restored after preemption) for the penalties.
  void accept(int32_t token);

  // A uniform double in [0, 1) from this request's stream (53 bits; the same on every platform).
  double uniform();

 private:
  struct Cut;
  bool has_penalties() const;
  void apply_penalties(std::span<float> logits) const;
  std::span<const float> prepare(std::span<const float> raw, std::span<const int32_t> banned);
  std::optional<Cut> cut(sampling::RowView& row) const;
  std::optional<int32_t> choose(sampling::RowView& row);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_set<int32_t> seen_;                // prompt + output (repetition penalty)
  std::unordered_map<int32_t, int32_t> generated_;  // output counts (frequency / presence)
  std::vector<float> scratch_;
  std::optional<double> pending_u_;  // drawn for a token not chosen yet (sample(candidates) gave up)
};

// log_softmax of the raw logits at `token`, plus the top_n most likely tokens (best first).
LogprobEntry compute_logprobs(std::span<const float> logits, int32_t token, int top_n);
// The same from a row's candidates; nullopt when they lack the token or the top_n.
std::optional<LogprobEntry> compute_logprobs(const LogitCandidates& row, int32_t token, int top_n);

}  // namespace moeserve
