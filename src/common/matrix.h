#pragma once
// Matrix: a typed view of a weight matrix, the unit every GEMM in every backend consumes.

#include <cstdint>

#include "common/dtype.h"

namespace moeserve {

// A row-major matrix W [rows, cols] used as y = x Wᵀ (torch Linear layout [out, in]).
// FP8 matrices carry scale_inv: float32 [ceil(rows/block_rows)][ceil(cols/block_cols)], and the real weight
// is fp8(W[r][c]) * scale_inv[r / block_rows][c / block_cols].
struct Matrix {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const float* scale_inv = nullptr;
  int block_rows = 0;
  int block_cols = 0;
  // Slot for a backend's own copy (e.g. a device pointer); the CPU backend leaves it empty.
  void* backend_data = nullptr;

  bool empty() const { return data == nullptr; }
  int64_t scale_cols() const { return block_cols ? (cols + block_cols - 1) / block_cols : 0; }
  // Row r widened to float32 (scales applied) into out[cols].
  void row_f32(int64_t r, float* out) const;
};

// A SwiGLU feed-forward block: down( silu(gate x) * up x ). Dense MLPs, routed and shared experts.
struct SwiGlu {
  Matrix gate, up, down;
};

}  // namespace moeserve
