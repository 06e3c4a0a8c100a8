#pragma once
// Vector kernels for the CPU backend, dispatched at run time to the best instruction set of the machine
// (AVX-512, AVX2, SSE4, NEON, scalar) through Highway, so one binary runs everywhere.

#include <cstddef>
#include <cstdint>

namespace moeserve::cpu {

float dot(const float* a, const float* b, size_t n);
// out[r] = dot(x, rows[r]) for 4 rows: x is loaded once for all four.
void dot4(const float* x, const float* r0, const float* r1, const float* r2, const float* r3, size_t n,
          float* out);
// dst[i] = bf16 bits src[i] widened to float32
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
// dst[i] = FP8 E4M3 code src[i] as float32, times `scale` (NaN codes are not expected in weights)
void fp8_e4m3_to_f32(const uint8_t* src, float scale, float* dst, size_t n);
// y += a * x
void axpy(float a, const float* x, float* y, size_t n);

}  // namespace moeserve::cpu
