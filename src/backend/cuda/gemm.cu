// Matmuls with float32 activations: the weight-streaming GEMV for small batches (decode) and a tiled SIMT
// GEMM for exact mode and weight dtypes cuBLAS does not take. Prefill-sized bf16 GEMMs go through cuBLAS.
#include <algorithm>

#include "backend/cuda/gemv.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvMaxTokens = 8;
// Matrices with at most this many rows take one row per warp (more blocks for short, wide matrices).
constexpr int64_t kGemvOneRowMax = 4096;

// y[t][r] = x[t] · w[r]. Block = kGemvWarps warps, each owning kGemvRowsPerWarp rows; blockIdx.y picks a
// group of kTokens tokens.
template <WType T, int kTokens, bool kVector, int kGemvRowsPerWarp>
__global__ __launch_bounds__(kGemvWarps * 32) void gemv_kernel(const float* __restrict__ x, int64_t n,
                                                               WeightView w, float* __restrict__ y) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kGemvRowsPerWarp;
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  if (row0 >= w.rows) return;
  const int nt = int(n - t0 < kTokens ? n - t0 : kTokens);
  const float* xr[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) xr[t] = x + (t0 + t) * w.cols;
  float acc[kGemvRowsPerWarp][kTokens] = {};
  gemv_lane<T, kGemvRowsPerWarp, kTokens, kVector>(xr, nt, w, row0, acc);
  warp_reduce_all(acc, nt);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < nt && row0 + r < w.rows) y[(t0 + t) * w.rows + row0 + r] = acc[r][t];
}

template <WType T, int kTokens, bool kVector, int kGemvRowsPerWarp>
__global__ __launch_bounds__(kGemvWarps * 32) void gemv_swiglu_kernel(const float* __restrict__ x, int64_t n,
                                                                      WeightView gate, WeightView up,
                                                                      float* __restrict__ h) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kGemvRowsPerWarp;
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  if (row0 >= gate.rows) return;
  const int nt = int(n - t0 < kTokens ? n - t0 : kTokens);
  const float* xr[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) xr[t] = x + (t0 + t) * gate.cols;
  float ag[kGemvRowsPerWarp][kTokens] = {}, au[kGemvRowsPerWarp][kTokens] = {};
  gemv_lane<T, kGemvRowsPerWarp, kTokens, kVector>(xr, nt, gate, row0, ag);
  gemv_lane<T, kGemvRowsPerWarp, kTokens, kVector>(xr, nt, up, row0, au);
  warp_reduce_all(ag, nt);
  warp_reduce_all(au, nt);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < nt && row0 + r < gate.rows) h[(t0 + t) * gate.rows + row0 + r] = siluf_(ag[r][t]) * au[r][t];
}

template <WType T, int kTokens, int kRows>
void gemv_launch(const float* x, int64_t n, const WeightView& w, const WeightView* up, float* y,
                 cudaStream_t s) {
  const dim3 grid(blocks_for(w.rows, kGemvWarps * kRows), unsigned((n + kTokens - 1) / kTokens));
  const bool vec =
      vector_rows<T>(w) && (!up || vector_rows<T>(*up)) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (up) {
    if (vec)
      gemv_swiglu_kernel<T, kTokens, true, kRows><<<grid, kGemvWarps * 32, 0, s>>>(x, n, w, *up, y);
    else
      gemv_swiglu_kernel<T, kTokens, false, kRows><<<grid, kGemvWarps * 32, 0, s>>>(x, n, w, *up, y);
  } else {
    if (vec)
      gemv_kernel<T, kTokens, true, kRows><<<grid, kGemvWarps * 32, 0, s>>>(x, n, w, y);
    else
      gemv_kernel<T, kTokens, false, kRows><<<grid, kGemvWarps * 32, 0, s>>>(x, n, w, y);
  }
}

template <WType T, int kTokens>
void gemv_dispatch(const float* x, int64_t n, const WeightView& w, const WeightView* up, float* y,
                   cudaStream_t s) {
  if (w.rows <= kGemvOneRowMax)
    gemv_launch<T, kTokens, 1>(x, n, w, up, y, s);
  else
    gemv_launch<T, kTokens, 2>(x, n, w, up, y, s);
}

template <WType T>
void gemv_tokens(const float* x, int64_t n, const WeightView& w, const WeightView* up, float* y,
                 cudaStream_t s) {
  if (n == 1)
    gemv_dispatch<T, 1>(x, n, w, up, y, s);
  else if (n == 2)
    gemv_dispatch<T, 2>(x, n, w, up, y, s);
  else if (n <= 4)
    gemv_dispatch<T, 4>(x, n, w, up, y, s);
  else
    gemv_dispatch<T, kGemvMaxTokens>(x, n, w, up, y, s);
}

// Tiled SIMT GEMM: 64 tokens × 64 weight rows per block, 16×16 threads of 4×4 outputs, k-steps of 16.
constexpr int kTile = 64, kStep = 16;

template <WType T>
__global__ __launch_bounds__(256) void gemm_simt_kernel(const float* __restrict__ x, int64_t n, WeightView w,
                                                        float* __restrict__ y) {
  __shared__ float xs[kStep][kTile + 4];
  __shared__ float ws[kStep][kTile + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t t_base = int64_t(blockIdx.y) * kTile, m_base = int64_t(blockIdx.x) * kTile;
  const int64_t K = w.cols, M = w.rows;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kStep) {
    for (int l = threadIdx.x; l < kTile * kStep; l += 256) {
      const int i = l / kStep, j = l % kStep;
      const int64_t t = t_base + i, m = m_base + i, k = k0 + j;
      xs[j][i] = (t < n && k < K) ? x[t * K + k] : 0.0f;
      ws[j][i] = (m < M && k < K) ? weight_at<T>(w, m, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kStep; ++j) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[j][ty * 4 + i], b[i] = ws[j][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[i][jj] = fmaf(a[i], b[jj], acc[i][jj]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int64_t t = t_base + ty * 4 + i, m = m_base + tx * 4 + jj;
      if (t < n && m < M) y[t * M + m] = acc[i][jj];
    }
}

}  // namespace

void launch_gemv(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s) {
  if (n == 0 || w.rows == 0) return;
  MOESERVE_DISPATCH_WTYPE(w.type, T, gemv_tokens<T>(x, n, w, nullptr, y, s));
}

void launch_gemv_swiglu(const float* x, int64_t n, const WeightView& gate, const WeightView& up, float* h,
                        cudaStream_t s) {
  if (n == 0 || gate.rows == 0) return;
  MOESERVE_DISPATCH_WTYPE(gate.type, T, gemv_tokens<T>(x, n, gate, &up, h, s));
}

void launch_gemm_simt(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s) {
  if (n == 0 || w.rows == 0) return;
  const dim3 grid(blocks_for(w.rows, kTile), blocks_for(n, kTile));
  MOESERVE_DISPATCH_WTYPE(w.type, T, gemm_simt_kernel<T><<<grid, 256, 0, s>>>(x, n, w, y));
}

}  // namespace moeserve::cuda
