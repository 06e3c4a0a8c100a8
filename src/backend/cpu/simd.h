#pragma once
// Vector kernels for the CPU backend, dispatched at run time to the best instruction set of the machine
// (AVX-512, AVX2, SSE4, NEON, scalar) through Highway, so one binary runs everywhere.

#include <cstddef>

namespace moeserve::cpu {

float dot(const float* a, const float* b, size_t n);
// out[r] = dot(x, rows[r]) for 4 rows: x is loaded once for all four.
void dot4(const float* x, const float* r0, const float* r1, const float* r2, const float* r3, size_t n,
          float* out);
// y += a * x
void axpy(float a, const float* x, float* y, size_t n);

}  // namespace moeserve::cpu
