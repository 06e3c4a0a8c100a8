#pragma once
// LogitCandidates: one logits row as Backend::logits_topk reduces it (its most likely tokens and the row's
// normalisers), read back on the host. Its own header so that the sampler needs neither the model nor the
// backend interface.

#include <cstdint>
#include <vector>

namespace moeserve {

struct LogitCandidates {
  float max = 0;                // the row's largest logit
  double sum_exp = 0;           // Σ exp(l - max) over the whole row
  double sum_exp_t = 0;         // Σ exp((l - max) / temperature) over the whole row
  int64_t vocab = 0;            // the row's length
  std::vector<int32_t> tokens;  // most likely first; ties: lower id first
  std::vector<float> logits;
  bool complete() const { return int64_t(tokens.size()) >= vocab; }
};

// Reads one record of Backend::logits_topk(k) over rows of `vocab`.
LogitCandidates read_logit_candidates(const float* record, int k, int64_t vocab);

}  // namespace moeserve
