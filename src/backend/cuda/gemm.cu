// Matmuls with float32 activations: the weight-streaming GEMV for small batches (decode) and a tiled SIMT
// GEMM for exact mode and weight dtypes cuBLAS does not take. Prefill-sized bf16 GEMMs go through cuBLAS.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/gemv.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvMaxTokens = 8;
// Matrices with at most this many rows take one row per warp (more blocks for short, wide matrices).
constexpr int64_t kGemvOneRowMax = 4096;

// Up to kGemvMaxSegments matrices over the same activations, one launch: blockIdx.x ranges
// [first_block[i], first_block[i+1]) compute y_i = x w_iᵀ.
struct GemvSegments {
  WeightView w[kGemvMaxSegments];
  float* y[kGemvMaxSegments];
  int first_block[kGemvMaxSegments + 1];
  int count;
};

// Rows [row0, row0 + rows) of w into L2 ahead of pdl_wait (vector rows only: whole 16-byte units).
template <WType T>
__device__ __forceinline__ void prefetch_rows(const WeightView& w, int64_t row0, int64_t rows) {
  rows = imin(rows, w.rows - row0);
  if (rows > 0)
    prefetch_l2(static_cast<const uint8_t*>(w.data) + row0 * w.cols * W<T>::kBytes,
                uint32_t(rows * w.cols * W<T>::kBytes));
}

// y[t][r] = x[t] · w[r]. Block = kGemvWarps warps, each owning kGemvRowsPerWarp rows; blockIdx.y picks a
// group of kTokens tokens.
template <WType T, int kTokens, bool kVector, int kGemvRowsPerWarp>
__global__ __launch_bounds__(kGemvWarps * 32) void gemv_kernel(const float* __restrict__ x, int64_t n,
                                                               GemvSegments segs) {
  int seg = 0;
  while (seg + 1 < segs.count && int(blockIdx.x) >= segs.first_block[seg + 1]) ++seg;
  WeightView w = segs.w[0];
  float* y = segs.y[0];
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i)
    if (seg == i) w = segs.w[i], y = segs.y[i];
  const int64_t block_row0 = int64_t(int(blockIdx.x) - segs.first_block[seg]) * kGemvWarps * kGemvRowsPerWarp;
  if constexpr (kVector)
    if (threadIdx.x == 0 && blockIdx.y == 0) prefetch_rows<T>(w, block_row0, kGemvWarps * kGemvRowsPerWarp);
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = block_row0 + warp * kGemvRowsPerWarp;
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
  const int64_t block_row0 = int64_t(blockIdx.x) * kGemvWarps * kGemvRowsPerWarp;
  if constexpr (kVector)
    if (threadIdx.x == 0 && blockIdx.y == 0) {
      prefetch_rows<T>(gate, block_row0, kGemvWarps * kGemvRowsPerWarp);
      prefetch_rows<T>(up, block_row0, kGemvWarps * kGemvRowsPerWarp);
    }
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = block_row0 + warp * kGemvRowsPerWarp;
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
void swiglu_launch(const float* x, int64_t n, const WeightView& w, const WeightView& up, float* y,
                   cudaStream_t s) {
  const dim3 grid(blocks_for(w.rows, kGemvWarps * kRows), unsigned((n + kTokens - 1) / kTokens));
  if (vector_rows<T>(w) && vector_rows<T>(up) && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    launch_k(gemv_swiglu_kernel<T, kTokens, true, kRows>, grid, kGemvWarps * 32, 0, s, x, n, w, up, y);
  else
    launch_k(gemv_swiglu_kernel<T, kTokens, false, kRows>, grid, kGemvWarps * 32, 0, s, x, n, w, up, y);
}

template <WType T, int kTokens, int kRows>
void segments_launch(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                     cudaStream_t s) {
  GemvSegments segs{};
  segs.count = count;
  bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  int blocks = 0;
  for (int i = 0; i < count; ++i) {
    segs.w[i] = ws[i], segs.y[i] = ys[i], segs.first_block[i] = blocks;
    blocks += int(blocks_for(ws[i].rows, kGemvWarps * kRows));
    vec = vec && vector_rows<T>(ws[i]);
  }
  segs.first_block[count] = blocks;
  const dim3 grid(unsigned(blocks), unsigned((n + kTokens - 1) / kTokens));
  if (vec)
    launch_k(gemv_kernel<T, kTokens, true, kRows>, grid, kGemvWarps * 32, 0, s, x, n, segs);
  else
    launch_k(gemv_kernel<T, kTokens, false, kRows>, grid, kGemvWarps * 32, 0, s, x, n, segs);
}

// Rows per warp: one (two for tall matrices) at 16-bit weights. An FP8 row holds half the bytes, so FP8 takes
// twice as many rows: a warp then streams as many bytes, with as many loads in flight, and each activation
// vector it loads serves two rows. MOESERVE_CUDA_FP8_GEMV_ROWS=1|2|4 overrides the FP8 choice (for
// measuring).
int fp8_gemv_rows_override() {
  static const int v = [] {
    const char* e = std::getenv("MOESERVE_CUDA_FP8_GEMV_ROWS");
    const int r = e ? std::atoi(e) : 0;
    return r == 1 || r == 2 || r == 4 ? r : 0;
  }();
  return v;
}

template <WType T>
int gemv_rows_per_warp(int64_t rows) {
  const int base = rows <= kGemvOneRowMax ? 1 : 2;
  if constexpr (T == WType::FP8) {
    const int o = fp8_gemv_rows_override();
    return o ? o : 2 * base;
  }
  return base;
}

// up == nullptr: the `count` matrices of ws as segments; else SwiGLU of ws[0] (gate) and *up.
template <WType T, int kTokens>
void gemv_dispatch(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                   const WeightView* up, cudaStream_t s) {
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) rows = std::max(rows, ws[i].rows);
  auto go = [&](auto rows_per_warp) {
    constexpr int R = decltype(rows_per_warp)::value;
    if (up)
      swiglu_launch<T, kTokens, R>(x, n, ws[0], *up, ys[0], s);
    else
      segments_launch<T, kTokens, R>(x, n, ws, ys, count, s);
  };
  const int r = gemv_rows_per_warp<T>(rows);
  if constexpr (T == WType::FP8) {
    if (r == 4) return go(std::integral_constant<int, 4>{});
  }
  if (r == 1)
    go(std::integral_constant<int, 1>{});
  else
    go(std::integral_constant<int, 2>{});
}

template <WType T>
void gemv_tokens(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                 const WeightView* up, cudaStream_t s) {
  if (n == 1)
    gemv_dispatch<T, 1>(x, n, ws, ys, count, up, s);
  else if (n == 2)
    gemv_dispatch<T, 2>(x, n, ws, ys, count, up, s);
  else if (n <= 4)
    gemv_dispatch<T, 4>(x, n, ws, ys, count, up, s);
  else
    gemv_dispatch<T, kGemvMaxTokens>(x, n, ws, ys, count, up, s);
}

// Tiled SIMT GEMM: 64 tokens × 64 weight rows per block, 16×16 threads of 4×4 outputs, k-steps of 16.
constexpr int kTile = 64, kStep = 16;

template <WType T>
__global__ __launch_bounds__(256) void gemm_simt_kernel(const float* __restrict__ x, int64_t n, WeightView w,
                                                        float* __restrict__ y) {
  pdl_begin();
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
  MOESERVE_DISPATCH_WTYPE(w.type, T, gemv_tokens<T>(x, n, &w, &y, 1, nullptr, s));
}

void launch_gemv_multi(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                       cudaStream_t s) {
  if (n == 0 || count == 0) return;
  MOESERVE_DISPATCH_WTYPE(ws[0].type, T, gemv_tokens<T>(x, n, ws, ys, count, nullptr, s));
}

void launch_gemv_swiglu(const float* x, int64_t n, const WeightView& gate, const WeightView& up, float* h,
                        cudaStream_t s) {
  if (n == 0 || gate.rows == 0) return;
  MOESERVE_DISPATCH_WTYPE(gate.type, T, gemv_tokens<T>(x, n, &gate, &h, 1, &up, s));
}

void launch_gemm_simt(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s) {
  if (n == 0 || w.rows == 0) return;
  const dim3 grid(blocks_for(w.rows, kTile), blocks_for(n, kTile));
  MOESERVE_DISPATCH_WTYPE(w.type, T, launch_k(gemm_simt_kernel<T>, grid, 256, 0, s, x, n, w, y));
}

}  // namespace moeserve::cuda
