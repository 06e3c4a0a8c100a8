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
//
// Under a JSON constraint (SamplingParams::json) only tokens the matcher accepts are chosen, and the request's
// end tokens only once the document is complete. Greedy takes the first accepted token in sampling order.
// Sampling draws from the cut distribution and, when the token is not accepted, removes it, renormalises and
// draws again: exactly a draw from the cut distribution restricted to accepted tokens (the cuts apply to the
// model's distribution, then the mask). After kMaxRejections (or one rejected draw from past kDeepDraw tokens
// down the order, where walking again costs more than a scan) it draws from that restricted distribution
// directly (every token of the cut checked); if the cut holds no accepted token (or only ones whose weight
// underflowed) it takes the most likely accepted token. No full-vocabulary scan happens while the likely tokens
// are valid.

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/logit_candidates.h"
#include "engine/engine.h"
#include "engine/json_constraint.h"

namespace moeserve {

struct TokenProb {
  int32_t token = 0;
  float prob = 0.0f;
};

namespace sampling {
class RowView;
}

// sample() returns this when a constraint leaves no token (the document is complete but its end token is
// banned or ignored, or the vocabulary cannot continue it).
constexpr int32_t kNoToken = -1;

class Sampler {
 public:
  static constexpr int kMaxRejections = 8;
  static constexpr size_t kDeepDraw = 4096;  // a rejected draw this far down the order ends the rejections

  Sampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed);

  // Applies params.json (when set); `end_tokens` end the request (eos unless ignored, stop ids).
  void constrain(std::vector<int32_t> end_tokens);
  // Under a constraint: the document read so far is a whole JSON value (false when unconstrained).
  bool constraint_complete() const;

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
  std::optional<int32_t> choose_constrained(sampling::RowView& row);
  bool allowed(int32_t token);
  double next_uniform();  // the draws of one choice, replayed when a candidates attempt gave up

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_set<int32_t> seen_;                // prompt + output (repetition penalty)
  std::unordered_map<int32_t, int32_t> generated_;  // output counts (frequency / presence)
  std::vector<float> scratch_;
  std::vector<double> pending_u_;  // drawn for a token not chosen yet (sample(candidates) gave up)
  size_t next_u_ = 0;

  // The JSON constraint: the matcher (active once start_after_token, if any, was generated).
  std::optional<JsonMatcher> matcher_;
  bool constraint_active_ = false;
  std::vector<int32_t> end_tokens_;
  std::array<int8_t, 256> first_byte_ok_;  // per first byte: accepted now? -1 unknown (reset on every token)
};

// log_softmax of the raw logits at `token`, plus the top_n most likely tokens (best first).
LogprobEntry compute_logprobs(std::span<const float> logits, int32_t token, int top_n);
// The same from a row's candidates; nullopt when they lack the token or the top_n.
std::optional<LogprobEntry> compute_logprobs(const LogitCandidates& row, int32_t token, int top_n);

}  // namespace moeserve
