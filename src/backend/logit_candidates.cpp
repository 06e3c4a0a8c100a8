#include "backend/logit_candidates.h"

#include <cstring>

#include "backend/backend.h"
#include "common/error.h"

namespace moeserve {

LogitCandidates read_logit_candidates(const float* record, int k, int64_t vocab) {
  LogitsTopkHeader h{};
  std::memcpy(&h, record, sizeof(h));
  check(h.count >= 0 && h.count <= k, "a logits record holds {} candidates of {}", h.count, k);
  LogitCandidates c;
  c.max = h.max;
  c.sum_exp = h.sum_exp;
  c.sum_exp_t = h.sum_exp_t;
  c.vocab = vocab;
  const float* values = record + sizeof(h) / sizeof(float);
  c.logits.assign(values, values + h.count);
  c.tokens.resize(size_t(h.count));
  std::memcpy(c.tokens.data(), values + k, size_t(h.count) * sizeof(int32_t));
  return c;
}

}  // namespace moeserve
