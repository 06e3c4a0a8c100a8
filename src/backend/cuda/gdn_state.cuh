#pragma once
// How the GDN kernels read and write a state slot's stored values: float32 as is, or bf16 widened into
// float32 registers and rounded back to nearest even when stored (the recurrence itself always runs in
// float32).
#include <cuda_bf16.h>

namespace moeserve::cuda {

__device__ __forceinline__ float state_load(const float* p) {
  return *p;
}
__device__ __forceinline__ float state_load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void state_store(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void state_store(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16_rn(x);
}

}  // namespace moeserve::cuda
