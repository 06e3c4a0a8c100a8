#pragma once
// Hopper's warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors for K-major tiles of 128-byte rows
// in the 128-byte swizzle, and the FP8 m64n128k32 instruction with float32 accumulators. A warpgroup is four
// consecutive warps (128 threads); accumulator d[4j + c] of thread (warp w, lane l) is row 16w + l/4 +
// 8(c/2), column 8j + 2(l%4) + c%2 of the 64 x 128 tile (mma.sync's m16n8 layout, stacked along N).
//
// The instructions exist only in sm_90a code: elsewhere (sm_121, or sm_90 without the "a") the MMA traps, and
// callers launch such kernels only on a device of compute capability 9.0 (wgmma_available() in moe_mma.cu).
#include <cstdint>

namespace moeserve::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESERVE_HAS_WGMMA 1
#else
#define MOESERVE_HAS_WGMMA 0
#endif

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows stored in the 128-byte swizzle: the
// chunk index XOR the row's index mod 8 (the tile 1024-byte aligned), so the 8 rows of a core matrix fall in
// 8 different bank groups.
__device__ __forceinline__ int sw128_offset(int r, int c) {
  return r * 128 + ((c ^ (r & 7)) << 4);
}

// The descriptor of such a tile: start address, leading byte offset (unused by swizzled K-major layouts),
// stride byte offset 1024 (from one 8-row core-matrix group to the next) and the 128-byte swizzle mode. The
// K step of an instruction (32 bytes of FP8) within the 128-byte rows is the start address plus 32 bytes:
// desc + 2 (the address is held in 16-byte units).
__device__ __forceinline__ uint64_t sw128_desc(const void* tile) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(tile));
  return uint64_t((a & 0x3FFFF) >> 4) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

// Shared-memory writes of the threads (st.shared, cp.async) become visible to wgmma's operand reads (the
// async proxy) after this fence and then a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if MOESERVE_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if MOESERVE_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MOESERVE_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most kPending of the warpgroup's committed MMA groups are in flight. The empty statements
// after it keep every use of d (the oldest group's accumulators) behind the wait: the compiler takes d as
// written by the MMA's own statement.
template <int kPending>
__device__ __forceinline__ void wgmma_wait(float (&d)[64]) {
#if MOESERVE_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// d (+)= A Bᵀ over 32 columns: A's 64 rows and B's 128 rows of e4m3, both K-major in shared memory
// (descriptors above). accumulate = false overwrites d.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t a, uint64_t b,
                                                      bool accumulate) {
#if MOESERVE_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(int(accumulate)));
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();
#endif
}

}  // namespace moeserve::cuda
