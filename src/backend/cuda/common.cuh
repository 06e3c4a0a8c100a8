#pragma once
// Device helpers shared by the kernels: weight loads of every stored dtype, warp/block reductions.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

// ---- programmatic dependent launch (sm_90+) --------------------------------------------------------------
// Every kernel is launched with launch_k, which lets it start while the previous kernel of the stream is
// still running (its launch and block setup overlap that kernel's tail), and begins with pdl_begin: wait
// until the previous grid has completed and its writes are visible, then allow the next kernel to launch.
// Each kernel thus still runs after all earlier work, transitively; only loads of immutable data (weights)
// may precede the wait. Elsewhere (no PDL attribute, older GPUs) the wait and the trigger are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}
// Starts pulling `bytes` (a multiple of 16, 16-byte aligned) at p into L2 (sm_90+): weights a kernel will
// stream, requested before pdl_wait so that the transfer overlaps the previous kernel.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// ---- asynchronous copies (sm_80+) ----------------------------------------------------------------------
// 16 bytes global -> shared without passing through registers; !valid writes zeros (src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// MOESERVE_CUDA_PDL=0 launches without the attribute (for measuring what it brings).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOESERVE_CUDA_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The arithmetic matches the CPU reference's (exact float32 functions: no fast-math intrinsics).
__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float siluf_(float x) {
  return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float fp8_to_float(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// Per stored dtype: bytes per element, elements per 16-byte vector, and loads widening to float32.
template <WType T>
struct W;

template <>
struct W<WType::F32> {
  static constexpr int kBytes = 4, kVec = 4;
  __device__ static void load_vec(const void* p, float* o) {
    float4 v = __ldg(reinterpret_cast<const float4*>(p));
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
  }
  __device__ static float load(const void* base, int64_t i) {
    return __ldg(static_cast<const float*>(base) + i);
  }
};

template <>
struct W<WType::BF16> {
  static constexpr int kBytes = 2, kVec = 8;
  __device__ static void load_vec(const void* p, float* o) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) o[2 * i] = bf16_lo(w[i]), o[2 * i + 1] = bf16_hi(w[i]);
  }
  __device__ static float load(const void* base, int64_t i) {
    return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(base) + i)) << 16);
  }
};

template <>
struct W<WType::F16> {
  static constexpr int kBytes = 2, kVec = 8;
  __device__ static void load_vec(const void* p, float* o) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h = *reinterpret_cast<const __half2*>(&w[i]);
      float2 f = __half22float2(h);
      o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
  }
  __device__ static float load(const void* base, int64_t i) {
    return __half2float(__ldg(static_cast<const __half*>(base) + i));
  }
};

// Two e4m3 codes (the low byte first) as float32: one packed cvt to f16x2 (sm_89+; exact, every e4m3 value is
// a normal f16), then f16x2 -> float2 (exact).
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}
// 16 e4m3 codes in a uint4 (element 0 in the lowest byte of .x) as float32.
__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float* o) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = fp8x2_to_float2(w[i]), b = fp8x2_to_float2(w[i] >> 16);
    o[4 * i] = a.x, o[4 * i + 1] = a.y, o[4 * i + 2] = b.x, o[4 * i + 3] = b.y;
  }
}

// FP8 block scales: a row's scales start at fp8_scale_row; a 16-byte vector at column c (a multiple of 16)
// takes scale [c >> fp8_col_shift]. The vector kernels require block_cols to be a power of two (see
// vector_rows), so no division runs per vector.
__device__ __forceinline__ const float* fp8_scale_row(const WeightView& w, int64_t row) {
  return w.scale_inv + int64_t(int(row) / w.block_rows) * w.scale_cols;
}
__device__ __forceinline__ int fp8_col_shift(const WeightView& w) {
  return __ffs(w.block_cols) - 1;
}
__host__ __device__ __forceinline__ bool is_pow2(int v) {
  return v > 0 && (v & (v - 1)) == 0;
}

template <>
struct W<WType::FP8> {
  static constexpr int kBytes = 1, kVec = 16;
  __device__ static void load_vec(const void* p, float* o) {
    fp8x16_to_float(__ldg(reinterpret_cast<const uint4*>(p)), o);
  }
  __device__ static float load(const void* base, int64_t i) {
    return fp8_to_float(__ldg(static_cast<const uint8_t*>(base) + i));
  }
};

// Element (r, c) of a weight matrix in float32, block scale applied.
template <WType T>
__device__ __forceinline__ float weight_at(const WeightView& w, int64_t r, int64_t c) {
  float v = W<T>::load(w.data, r * w.cols + c);
  if constexpr (T == WType::FP8) v *= w.scale_inv[(r / w.block_rows) * w.scale_cols + c / w.block_cols];
  return v;
}

struct SumOp {
  static constexpr float kIdentity = 0.0f;
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  static constexpr float kIdentity = -INFINITY;
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, SumOp{});
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, MaxOp{});
}

// Reduction over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result, the warps'
// partial results combined in warp order. `scratch` holds 32 floats; the call ends with the block
// synchronised.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = Op::kIdentity;
  for (int i = 0; i < warps; ++i) r = op(r, scratch[i]);
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, SumOp{});
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, MaxOp{});
}

// Dispatches a runtime WType to a template parameter.
#define MOESERVE_DISPATCH_WTYPE(type, T, ...) \
  switch (type) {                             \
    case WType::F32: {                        \
      constexpr WType T = WType::F32;         \
      __VA_ARGS__;                            \
    } break;                                  \
    case WType::F16: {                        \
      constexpr WType T = WType::F16;         \
      __VA_ARGS__;                            \
    } break;                                  \
    case WType::BF16: {                       \
      constexpr WType T = WType::BF16;        \
      __VA_ARGS__;                            \
    } break;                                  \
    case WType::FP8: {                        \
      constexpr WType T = WType::FP8;         \
      __VA_ARGS__;                            \
    } break;                                  \
  }

// min/max over int64_t without relying on which integer overloads the CUDA headers declare.
template <typename T>
__host__ __device__ __forceinline__ T imin(T a, T b) {
  return a < b ? a : b;
}

inline unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

}  // namespace moeserve::cuda
