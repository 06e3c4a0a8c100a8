#pragma once
// Block-scaled FP8 E4M3 quantisation, as Qwen's and DeepSeek's FP8 checkpoints store weights: per block of
// rows x cols, scale = amax / 448, stored value fp8(w / scale), and weight_scale_inv = scale.
// init-model and make_dummy_weights use it to write FP8 checkpoints.

#include <cstdint>

namespace moeserve {

// Nearest E4M3 code, ties to even, saturating at ±448; the same result as common's f32_to_fp8_e4m3
// (a table search) but by bit arithmetic, fast enough for billions of weights.
uint8_t fp8_e4m3_nearest(float f);

// The scales alone (scale_inv[b] = amax of block b / 448, or 1 for an all-zero block).
void fp8_band_scales(const float* w, int64_t rows, int64_t cols, int block_cols, float* scale_inv);

// Quantises one band of up to block_rows rows of a row-major matrix w[rows][cols] into out[rows][cols] and
// its scales scale_inv[ceil(cols / block_cols)] (one per block of the band).
void quantize_fp8_band(const float* w, int64_t rows, int64_t cols, int block_cols, uint8_t* out,
                       float* scale_inv);

}  // namespace moeserve
