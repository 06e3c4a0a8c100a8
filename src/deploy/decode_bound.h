#pragma once
// The memory-bandwidth bound of a decode step: the bytes one rank must move to decode one token for each of
// `batch` sequences of `context` tokens (every weight the step reads, the KV it attends over, the GDN state
// it reads and writes back), and the time they take at a bandwidth. Routing is taken as uniform, as the
// benchmarks' dummy weights route: a layer's tokens touch E (1 - (1 - k/E)^batch) of its E experts on
// average; a trained router concentrates and touches fewer, so for real checkpoints the bytes bound from
// above. Activations, sampling and launch costs are left out: it is the floor a schedule of kernels can
// approach, not a prediction of one.

#include <cstdint>

#include "deploy/footprint.h"
#include "model/config.h"

namespace moeserve::deploy {

// Experts a layer's tokens touch when each picks k of E uniformly at random: E (1 - (1 - k/E)^tokens).
double expected_experts_touched(int experts, int top_k, int64_t tokens);

struct DecodeStepBytes {
  double routed_experts = 0;  // the experts the batch touches
  double other_weights = 0;   // every other weight the step reads: projections, shared expert, router, norms
  double lm_head = 0;         // the output projection (the embeddings when tied)
  double kv = 0;              // batch x context tokens of every attention layer's K and V
  double state = 0;           // the GDN recurrent and conv states, read and written
  double total() const { return routed_experts + other_weights + lm_head + kv + state; }
  // Seconds a step takes at `bandwidth` bytes/s.
  double seconds(double bandwidth) const { return total() / bandwidth; }
};
DecodeStepBytes decode_step_bytes(const ModelConfig& config, const Precision& precision, int tp,
                                  int64_t batch, int64_t context);

}  // namespace moeserve::deploy
