#pragma once
// The inner loops of the weight-streaming GEMV kernels (dense and per-expert): one warp, kRows weight rows,
// up to kTokens activation rows given by pointer.

#include "backend/cuda/common.cuh"

namespace moeserve::cuda {

// Whether rows can be read as 16-byte vectors: the row length is whole vectors and the base is aligned.
template <WType T>
inline bool vector_rows(const WeightView& w) {
  bool ok =
      (w.cols * W<T>::kBytes) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.cols % 4 == 0;
  if constexpr (T == WType::FP8)  // a vector never straddles scales; its scale is found by a shift
    ok = ok && w.block_cols % W<T>::kVec == 0 && is_pow2(w.block_cols);
  return ok;
}

// xv = x[c*V, c*V + V) as float4 loads through the read-only cache (x 16-byte aligned). The chunk index keeps
// its caller's type (int where the caller proved it fits): the address arithmetic, and so the registers, stay
// the caller's.
template <int V, typename Index>
__device__ __forceinline__ void load_x_vec(const float* x, Index c, float (&xv)[V]) {
  const float4* xp = reinterpret_cast<const float4*>(x + c * V);
#pragma unroll
  for (int e = 0; e < V / 4; ++e) {
    const float4 f = __ldg(xp + e);
    xv[4 * e] = f.x, xv[4 * e + 1] = f.y, xv[4 * e + 2] = f.z, xv[4 * e + 3] = f.w;
  }
}

// The tile step every GEMV-style loop shares: acc[r][t] += wv[r] · x[t][chunk c] for the tokens t < nt,
// each x vector loaded once and used by every row. kScaled (FP8): a row's V products are summed first and
// scaled once by sc[r] (a vector lies in one scale block); otherwise sc is not read.
template <bool kScaled, int V, int kRows, int kTokens, typename Index>
__device__ __forceinline__ void fma_tile(const float (&wv)[kRows][V], const float* sc,
                                         const float* const (&x)[kTokens], Index c, int nt,
                                         float (&acc)[kRows][kTokens]) {
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t < nt) {
      float xv[V];
      load_x_vec(x[t], c, xv);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if constexpr (kScaled) {
          float p = 0.0f;
#pragma unroll
          for (int e = 0; e < V; ++e) p = fmaf(wv[r][e], xv[e], p);
          acc[r][t] = fmaf(sc[r], p, acc[r][t]);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r][t] = fmaf(wv[r][e], xv[e], acc[r][t]);
        }
      }
    }
  }
}

// acc[r][t] += w[row0 + r] · x[t] over this lane's share of the columns (the caller reduces across the warp);
// rows ≥ w.rows contribute 0, tokens ≥ nt are skipped. In the vector form the x rows must be 16-byte aligned.
template <WType T, int kRows, int kTokens, bool kVector>
__device__ __forceinline__ void gemv_lane(const float* const (&x)[kTokens], int nt, const WeightView& w,
                                          int64_t row0, float (&acc)[kRows][kTokens]) {
  const int lane = threadIdx.x & 31;
  const int64_t K = w.cols;
  const auto* base = static_cast<const uint8_t*>(w.data);
  if constexpr (kVector && T == WType::FP8) {
    // FP8: each vector's 16 products are summed first and scaled once (a vector lies in one scale block);
    // rows past the matrix read its last row with scale 0, so the loads need no branch.
    constexpr int V = W<T>::kVec;
    const int chunks = int(K / V), shift = fp8_col_shift(w);
    const uint8_t* wrow[kRows];
    const float* srow[kRows];
    float live[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = imin<int64_t>(row0 + r, w.rows - 1);
      wrow[r] = base + row * K;
      srow[r] = fp8_scale_row(w, row);
      live[r] = row0 + r < w.rows ? 1.0f : 0.0f;
    }
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
      float wv[kRows][V], sc[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        W<T>::load_vec(wrow[r] + c * V, wv[r]);
        sc[r] = __ldg(srow[r] + ((c * V) >> shift)) * live[r];
      }
      fma_tile<true>(wv, sc, x, c, nt, acc);
    }
  } else if constexpr (kVector) {
    constexpr int V = W<T>::kVec;
    const int64_t chunks = K / V;
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += 32) {
      float wv[kRows][V];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = row0 + r;
        if (row < w.rows) {
          W<T>::load_vec(base + (row * K + c * V) * W<T>::kBytes, wv[r]);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) wv[r][e] = 0.0f;
        }
      }
      fma_tile<false>(wv, nullptr, x, c, nt, acc);
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = row0 + r;
        const float wk = row < w.rows ? weight_at<T>(w, row, k) : 0.0f;
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
          if (t < nt) acc[r][t] = fmaf(wk, x[t][k], acc[r][t]);
      }
    }
  }
}

// Warp sums of the accumulators of the first nt tokens (nt is the same for the whole warp).
template <int kRows, int kTokens>
__device__ __forceinline__ void warp_reduce_all(float (&acc)[kRows][kTokens], int nt) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
      if (t < nt) acc[r][t] = warp_sum(acc[r][t]);
}

}  // namespace moeserve::cuda
