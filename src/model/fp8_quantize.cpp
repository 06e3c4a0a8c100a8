#include "model/fp8_quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace moeserve {

uint8_t fp8_e4m3_nearest(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a <
      0.015625f) {  // below 2^-6: subnormals, multiples of 2^-9 (8 * 2^-9 is code 0x08, the smallest normal)
    return sign | uint8_t(std::nearbyint(a * 512.0f));
  }
  // Round the float32 mantissa to 3 bits, ties to even; a carry moves into the exponent as it should.
  uint32_t u = std::bit_cast<uint32_t>(a);
  u += 0x7ffffu + ((u >> 20) & 1u);
  uint32_t code = (((u >> 23) - 127 + 7) << 3) | ((u >> 20) & 7u);
  return sign | uint8_t(std::min<uint32_t>(code, 0x7e));
}

void fp8_band_scales(const float* w, int64_t rows, int64_t cols, int block_cols, float* scale_inv) {
  for (int64_t c0 = 0, b = 0; c0 < cols; c0 += block_cols, ++b) {
    int64_t c1 = std::min<int64_t>(cols, c0 + block_cols);
    float amax = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    scale_inv[b] = amax > 0 ? amax / 448.0f : 1.0f;
  }
}

void quantize_fp8_band(const float* w, int64_t rows, int64_t cols, int block_cols, uint8_t* out,
                       float* scale_inv) {
  fp8_band_scales(w, rows, cols, block_cols, scale_inv);
  for (int64_t c0 = 0, b = 0; c0 < cols; c0 += block_cols, ++b) {
    int64_t c1 = std::min<int64_t>(cols, c0 + block_cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = fp8_e4m3_nearest(w[r * cols + c] / scale_inv[b]);
  }
}

}  // namespace moeserve
