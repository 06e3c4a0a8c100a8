#include "deploy/decode_bound.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace moeserve::deploy {

double expected_experts_touched(int experts, int top_k, int64_t tokens) {
  check(experts > 0 && top_k >= 1 && top_k <= experts && tokens >= 0, "{} of {} experts for {} tokens", top_k,
        experts, tokens);
  return experts * (1.0 - std::pow(1.0 - double(top_k) / experts, double(tokens)));
}

DecodeStepBytes decode_step_bytes(const ModelConfig& c, const Precision& p, int tp, int64_t batch,
                                  int64_t context) {
  validate_precision(p, "decode bound");
  check(tp >= 1 && batch >= 1 && context >= 0, "decode bound: tp {}, batch {}, context {}", tp, batch,
        context);
  DecodeStepBytes b;
  const double touched =
      c.is_moe ? expected_experts_touched(c.num_experts, c.num_experts_per_tok, batch) / c.num_experts : 0;
  for (const auto& g : tensor_inventory(c)) {
    const double bytes = rank_bytes(g, c, p, tp);
    if (g.name.find("mlp.experts.") != std::string::npos)
      b.routed_experts += bytes * touched;
    else if (g.name.starts_with("lm_head") || (c.tie_word_embeddings && g.name.starts_with("embed_tokens")))
      b.lm_head += bytes;
    else if (g.name.starts_with("embed_tokens"))  // a row per sequence
      b.other_weights += bytes * std::min(1.0, double(batch) / double(g.rows));
    else
      b.other_weights += bytes;
  }
  const Footprint f = footprint(c, p, tp, /*prefill_chunk=*/1, /*max_running=*/1);
  b.kv = f.kv_per_token * double(batch) * double(context);
  b.state = 2.0 * f.state_per_sequence * double(batch);
  return b;
}

}  // namespace moeserve::deploy
