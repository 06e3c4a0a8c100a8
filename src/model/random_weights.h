#pragma once
// Random weights of any Qwen3.5 shape with the matrices made by the caller (host memory for tests, device
// memory for GPU benchmarks and `serve --load-format dummy --device cuda`, where building 70 GB on the host
// first would take minutes). Scales keep activations O(1) through any depth: linear layers uniform in
// ±sqrt(3/in), embeddings in ±1; the small vectors (norms, gates, conv taps) are host floats, as a checkpoint
// loader makes them.

#include <cstdint>
#include <functional>

#include "model/weights.h"

namespace moeserve {

// make(rows, cols, bound, quantizable): a matrix with values uniform in [-bound, bound). quantizable is false
// for the matrices Qwen's FP8 releases keep in BF16 (embeddings, lm_head, the router, the shared-expert gate,
// GDN's in_proj_a and in_proj_b), so that FP8 dummy weights have a real checkpoint's mix of dtypes.
using MatrixMaker = std::function<Matrix(int64_t rows, int64_t cols, float bound, bool quantizable)>;

ModelWeights make_random_weights(const ModelConfig& config, const MatrixMaker& make, uint32_t seed = 1);

}  // namespace moeserve
