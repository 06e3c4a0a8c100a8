#pragma once
// Naive double-precision references for backend op tests, and random data helpers.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/matrix.h"

namespace moeserve::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A matrix stored as bf16 (owning its bytes) plus its exact float values.
struct Bf16Matrix {
  std::vector<uint16_t> bits;
  std::vector<float> values;
  Matrix view;
  Bf16Matrix(int64_t rows, int64_t cols, uint32_t seed, float scale = 0.2f) {
    auto v = random_vector(size_t(rows * cols), seed, scale);
    for (float x : v) {
      bits.push_back(f32_to_bf16(x));
      values.push_back(bf16_to_f32(bits.back()));
    }
    view = Matrix{DType::BF16, rows, cols, bits.data()};
  }
};

inline std::vector<double> naive_matmul(const std::vector<float>& x, int64_t n, const std::vector<float>& w,
                                        int64_t rows, int64_t cols) {
  std::vector<double> y(size_t(n * rows));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += double(x[t * cols + c]) * w[r * cols + c];
      y[t * rows + r] = acc;
    }
  return y;
}

inline double silu(double x) { return x / (1 + std::exp(-x)); }
inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace moeserve::testing
