#pragma once
// Activations to e4m3 per 1x128 block, as the FP8 prefill matmuls (fp8_lt.cu) and the FP8 x FP8 experts
// (moe_mma.cu) take them, and as SGLang's and vLLM's FP8 block paths quantize: scale = amax / 448 (1 for an
// all-zero block), q = e4m3(x / scale), saturating.
#include <cuda_fp8.h>

#include "backend/cuda/common.cuh"

namespace moeserve::cuda {

constexpr int kFp8QuantBlock = 128;  // values per scale: one warp, four per lane

// One warp's block: this lane's four consecutive values into q (4 bytes); returns the block's scale.
__device__ __forceinline__ float quantize_e4m3_x4(const float (&v)[4], uint8_t* q) {
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q) = uint32_t(lo) | (uint32_t(hi) << 16);
  return scale;
}

}  // namespace moeserve::cuda
