#pragma once
// The tensor-core step shared by the FP8 matmul kernels (gemm_fp8.cu, and the MoE's in moe.cu): FP8 weight
// rows (bf16 ones too, for gemm_fp8.cu's small batches) against float32 activations on mma.sync m16n8k16
// bf16 with float32 accumulation. The bf16 MMA and
// ldmatrix wrappers serve every mma.sync kernel (moe_mma.cu, attention.cu).
//
// The weights enter the MMA exactly (e4m3 -> f16 -> float -> bf16 loses nothing: 4 significant bits). The
// activations are bf16: one term (rounded, as the cuBLAS path rounds them) or three (x = hi + mid + lo, each
// bf16, the rest below 2^-24 |x|: float32 accuracy, for the paths whose results must match float32 math).
//
// Fragments. A warp takes 32 weight rows (two m16 tiles) and 128-column chunks (one block scale each).
// Thread (g, q) = (lane / 4, lane % 4) loads bytes [16q, 16q+16) and [64+16q, 64+16q+16) of the chunk from
// rows g, g+8, g+16, g+24: 16-byte loads, 64 contiguous bytes per row per instruction. The MMA's k order
// within a chunk is a permutation of the columns: step s (0..7) takes, as its logical columns 2q..2q+1 and
// 2q+8..2q+9, this thread's physical pairs p = 2(s%4) and p+1 of half h = s/4, i.e. columns 64h + 16q + 2p
// (+1). The activation fragment uses the same permutation, so thread (g, q) needs token g's values at
// exactly the columns it loads weights for: x[token g][64h + 16q + 2p, +1] as bf16x2, p = 0..7, h = 0..1.
// The accumulator element e of m tile m, token tile j is row 16m + g + 8(e / 2), token 8j + 2q + (e % 2).
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"

namespace moeserve::cuda {

constexpr int kMmaChunk = 128;    // columns per step: one block scale
constexpr int kMmaWarpRows = 32;  // weight rows per warp

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}
__device__ __forceinline__ float bf16_lo_f(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi_f(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}
// The e4m3 pair p (0..7) of a 16-byte load (bytes 2p and 2p+1) as bf16x2, exactly, without the conversion
// unit: cvt issues at a quarter of the integer rate, and four of them per pair (e4m3x2 -> f16x2 -> 2 floats
// -> bf16x2) bound the FP8 MMA kernels. An e4m3 code's exponent and mantissa bits moved to a bf16's places
// read as the code's value times 2^-120, normal and subnormal alike (in both formats a subnormal's mantissa
// counts steps of the smallest normal exponent), so one bf16x2 multiply by 2^120 restores it. Codes 0x7f and
// 0xff (NaN) are not weights.
__device__ __forceinline__ uint32_t fp8_pair_bf16x2(const uint4& v, int p) {
  const uint32_t w = p < 2 ? v.x : p < 4 ? v.y : p < 6 ? v.z : v.w;
  const uint32_t spread = __byte_perm(w, 0, (p & 1) ? 0x4342 : 0x4140);  // codes in bits 0-7 and 16-23
  const uint32_t bits = ((spread & 0x007f007fu) << 4) | ((spread & 0x00800080u) << 8);
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
              __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80)));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// The e4m3 pair p (0..7) of a 16-byte load: bytes 2p and 2p+1, in the low 16 bits.
__device__ __forceinline__ uint32_t fp8_pair(const uint4& v, int p) {
  const uint32_t w = p < 2 ? v.x : p < 4 ? v.y : p < 6 ? v.z : v.w;
  return (p & 1) ? w >> 16 : w & 0xffffu;
}

// Four 8x8 bf16 matrices from shared memory, one row address per lane (lanes 8i..8i+7: matrix i), as
// mma.sync fragments; _trans delivers each matrix transposed (a row-major [k][n] tile as B's columns).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Not volatile: the MMA is a pure function of its registers, so the compiler may schedule it among the
// fragment loads instead of stalling on each in program order.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// FP8 x FP8: A's registers hold four e4m3 each (rows g and g + 8, columns 4q.. and 16 + 4q..), B's two.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The kTerms bf16x2 words of a float pair: x = Σ terms (kTerms 1: rounded; 3: float32-exact to 2^-24).
template <int kTerms>
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t (&out)[kTerms]) {
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    out[t] = bf16x2_bits(a, b);
    if (t + 1 < kTerms) a -= bf16_lo_f(out[t]), b -= bf16_hi_f(out[t]);
  }
}

// This thread's activation fragment of one token row for a chunk starting at column k0 (x 16-byte aligned):
// xf[t][h][p] = term t of x[k0 + 64h + 16q + 2p, +1]. `live` false gives zeros.
template <int kTerms>
__device__ __forceinline__ void load_x_fragment(const float* __restrict__ xrow, int64_t k0, int q, bool live,
                                                uint32_t (&xf)[kTerms][2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      float4 f = __ldg(reinterpret_cast<const float4*>(xrow + k0 + 64 * h + 16 * q) + v);
      if (!live) f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      uint32_t a[kTerms], b[kTerms];
      split_bf16x2<kTerms>(f.x, f.y, a);
      split_bf16x2<kTerms>(f.z, f.w, b);
#pragma unroll
      for (int t = 0; t < kTerms; ++t) xf[t][h][2 * v] = a[t], xf[t][h][2 * v + 1] = b[t];
    }
}

// This thread's weight bytes of a chunk: rows r0 + g + 8i (i = 0..3), already offset by 16q.
__device__ __forceinline__ void load_w_fragment(const uint8_t* const (&wp)[4], int64_t k0,
                                                uint4 (&wv)[4][2]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    wv[i][0] = __ldg(reinterpret_cast<const uint4*>(wp[i] + k0));
    wv[i][1] = __ldg(reinterpret_cast<const uint4*>(wp[i] + k0 + 64));
  }
}

// bf16 weights: the same columns are 32 bytes per row and half (16 values), so thread (g, q) loads bytes
// [32q, 32q + 32) of each 128-byte half instead, rows r0 + g + 8i; word p of half h is the bf16x2 of columns
// 64h + 16q + 2p (+1), the pair the FP8 path widens (wp already offset by 32q).
__device__ __forceinline__ void load_w_fragment_bf16(const uint8_t* const (&wp)[4], int64_t byte0,
                                                     uint4 (&wv)[4][2][2]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wv[i][h][0] = __ldg(reinterpret_cast<const uint4*>(wp[i] + byte0 + 128 * h));
      wv[i][h][1] = __ldg(reinterpret_cast<const uint4*>(wp[i] + byte0 + 128 * h + 16));
    }
}

__device__ __forceinline__ uint32_t word_of(const uint4 (&v)[2], int p) {
  const uint4& u = v[p >> 2];
  const int w = p & 3;
  return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

// part[m][j] += rows of wv (bf16, m tile m) · token tile j's fragments, over one chunk: mma_chunk's steps.
template <int kNT, int kTerms>
__device__ __forceinline__ void mma_chunk_bf16(const uint4 (&wv)[4][2][2],
                                               const uint32_t (&xf)[kNT][kTerms][2][8],
                                               float (&part)[2][kNT][4]) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int h = s >> 2, p = 2 * (s & 3);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t a0 = word_of(wv[2 * m][h], p), a1 = word_of(wv[2 * m + 1][h], p);
      const uint32_t a2 = word_of(wv[2 * m][h], p + 1), a3 = word_of(wv[2 * m + 1][h], p + 1);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int t = 0; t < kTerms; ++t)
          mma_bf16(part[m][j], a0, a1, a2, a3, xf[j][t][h][p], xf[j][t][h][p + 1]);
    }
  }
}

// part[m][j] += rows of wv (m tile m) · token tile j's fragments, over one chunk (8 MMA steps per term).
template <int kNT, int kTerms>
__device__ __forceinline__ void mma_chunk(const uint4 (&wv)[4][2], const uint32_t (&xf)[kNT][kTerms][2][8],
                                          float (&part)[2][kNT][4]) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int h = s >> 2, p = 2 * (s & 3);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t a0 = fp8_pair_bf16x2(wv[2 * m][h], p);
      const uint32_t a1 = fp8_pair_bf16x2(wv[2 * m + 1][h], p);
      const uint32_t a2 = fp8_pair_bf16x2(wv[2 * m][h], p + 1);
      const uint32_t a3 = fp8_pair_bf16x2(wv[2 * m + 1][h], p + 1);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int t = 0; t < kTerms; ++t)
          mma_bf16(part[m][j], a0, a1, a2, a3, xf[j][t][h][p], xf[j][t][h][p + 1]);
    }
  }
}

}  // namespace moeserve::cuda
