// The routed-expert path, with no host synchronisation (so a decode step can be recorded as a CUDA graph):
//   route   — per token: softmax over the router logits, top-k (ties to the lower id), renormalised weights
//   plan    — one block groups the (token, expert) pairs by expert and cuts each expert's rows into work
//             items of at most `tile` rows; the item count stays on the device
//   experts — gate/up then down over every item: a grid sized for the most items there can be, whose extra
//             blocks exit. SIMT GEMV-style kernels with float32 activations for small batches (and exact
//             mode), a grouped bf16 tensor-core GEMM over 64-row items for large ones (moe_mma.cu)
//   combine — per token, Σ_k w_k · y_k in ascending expert id, as the CPU (and HF) accumulate.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/gemv.cuh"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr int kPerLane = kMaxExperts / 32;

// One warp routes one token. The row is read once, all its loads in flight together: three passes over it
// in global memory, each load waiting on the one before, made routing 256 tokens in one block take 87 µs.
__device__ __forceinline__ void route_token(const float* __restrict__ logits, int64_t row, int E, int k,
                                            bool renormalize, int32_t* __restrict__ ids,
                                            float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  const float* l = logits + row * E;
  float p[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = lane + 32 * i < E ? l[lane + 32 * i] : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) mx = fmaxf(mx, p[i]);
  mx = warp_max(mx);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    p[i] = lane + 32 * i < E ? expf(p[i] - mx) : 0.0f;
    total += p[i];
  }
  total = warp_sum(total);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    p[i] = lane + 32 * i < E ? p[i] / total : -1.0f;  // taken and absent experts read as -1
  float chosen = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bp = -1.0f;
    int be = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (p[i] > bp) bp = p[i], be = lane + 32 * i;  // ascending ids: the first maximum wins
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (op > bp || (op == bp && oe < be)) bp = op, be = oe;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == be) p[i] = -1.0f;
    chosen += bp;
    if (lane == 0) ids[row * k + j] = be, weights[row * k + j] = bp;
  }
  __syncwarp();  // lane 0's writes above are read by the other lanes
  if (renormalize && lane < k) weights[row * k + lane] /= chosen;
}

__global__ void moe_route_kernel(const float* __restrict__ logits, int64_t n, int E, int k, bool renormalize,
                                 int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (row < n) route_token(logits, row, E, k, renormalize, ids, weights);
}

// Groups the pairs by expert; run by one whole block. Shared: counts, offsets, cursors, item offsets.
__device__ __forceinline__ void plan_block(const int32_t* __restrict__ ids, int64_t P, int E, int tile,
                                           int32_t* __restrict__ sorted, int32_t* __restrict__ pair_row,
                                           int32_t* __restrict__ items, int32_t* __restrict__ num_items) {
  __shared__ int counts[kMaxExperts], offsets[kMaxExperts], cursor[kMaxExperts], item_off[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0, cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&counts[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, chunk = (E + 31) / 32;
    const int e0 = imin(E, lane * chunk), e1 = imin(E, e0 + chunk);
    int rows = 0, its = 0;
    for (int e = e0; e < e1; ++e) rows += counts[e], its += (counts[e] + tile - 1) / tile;
    int rows_incl = rows, its_incl = its;
    for (int o = 1; o < 32; o <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, rows_incl, o), i = __shfl_up_sync(0xffffffffu, its_incl, o);
      if (lane >= o) rows_incl += r, its_incl += i;
    }
    int row_at = rows_incl - rows, item_at = its_incl - its;
    for (int e = e0; e < e1; ++e) {
      offsets[e] = row_at, item_off[e] = item_at;
      row_at += counts[e], item_at += (counts[e] + tile - 1) / tile;
    }
    if (lane == 31) *num_items = its_incl;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = ids[p];
    const int pos = offsets[e] + atomicAdd(&cursor[e], 1);
    sorted[pos] = int32_t(p);
    pair_row[p] = pos;
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int c = counts[e];
    for (int i = 0; i * tile < c; ++i) {
      int32_t* it = items + 3 * (item_off[e] + i);
      it[0] = e, it[1] = offsets[e] + i * tile, it[2] = imin(tile, c - i * tile);
    }
  }
}

__global__ void moe_plan_kernel(const int32_t* __restrict__ ids, int64_t P, int E, int tile,
                                int32_t* __restrict__ sorted, int32_t* __restrict__ pair_row,
                                int32_t* __restrict__ items, int32_t* __restrict__ num_items) {
  pdl_begin();
  plan_block(ids, P, E, tile, sorted, pair_row, items, num_items);
}

// Small batches: routing and planning in one launch (one block; warp w routes tokens w, w+32, ...). Larger
// ones route a token per warp over the whole GPU, then plan in one block: ncu, 64 tokens fused 25 µs, 256
// tokens in two launches 6.7 + 6.4 µs; 16 tokens fused 10.5 µs.
constexpr int64_t kFusedRouteMaxTokens = 16;
__global__ void moe_route_plan_kernel(const float* __restrict__ logits, int64_t n, int E, int k,
                                      bool renormalize, int tile, int32_t* __restrict__ ids,
                                      float* __restrict__ weights, int32_t* __restrict__ sorted,
                                      int32_t* __restrict__ pair_row, int32_t* __restrict__ items,
                                      int32_t* __restrict__ num_items) {
  pdl_begin();
  for (int64_t row = threadIdx.x >> 5; row < n; row += blockDim.x >> 5)
    route_token(logits, row, E, k, renormalize, ids, weights);
  __syncthreads();  // the block's global writes of ids are visible to all of it
  plan_block(ids, n * k, E, tile, sorted, pair_row, items, num_items);
}

__device__ __forceinline__ WeightView expert_view(const ExpertTable& t, const void* const* data,
                                                  const float* const* scales, int e, int64_t rows,
                                                  int64_t cols) {
  WeightView w;
  w.type = t.type;
  w.data = data[e];
  w.scale_inv = scales ? scales[e] : nullptr;
  w.rows = rows, w.cols = cols;
  w.block_rows = t.block_rows, w.block_cols = t.block_cols;
  w.scale_cols = t.block_cols ? (cols + t.block_cols - 1) / t.block_cols : 0;
  return w;
}

constexpr int kSimtWarps = 8, kSimtRows = 2;

// h[row] = silu(x_row · gate_i) * (x_row · up_i) for the item's rows, x rows gathered through `sorted`.
template <WType T, bool kVector, int kTile>
__global__ __launch_bounds__(kSimtWarps * 32) void moe_gate_up_simt(
    ExpertTable t, const float* __restrict__ x, int top_k, const int32_t* __restrict__ sorted,
    const int32_t* __restrict__ items, const int32_t* __restrict__ num_items, float* __restrict__ h) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kSimtWarps + warp) * kSimtRows;
  if (row0 >= t.inter) return;
  const WeightView g = expert_view(t, t.gate, t.gate_scale, e, t.inter, t.hidden);
  const WeightView u = expert_view(t, t.up, t.up_scale, e, t.inter, t.hidden);
  const float* xr[kTile];
#pragma unroll
  for (int b = 0; b < kTile; ++b) xr[b] = x + int64_t(sorted[first + imin(b, count - 1)] / top_k) * t.hidden;
  float ag[kSimtRows][kTile] = {}, au[kSimtRows][kTile] = {};
  gemv_lane<T, kSimtRows, kTile, kVector>(xr, count, g, row0, ag);
  gemv_lane<T, kSimtRows, kTile, kVector>(xr, count, u, row0, au);
  warp_reduce_all(ag, count);
  warp_reduce_all(au, count);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
      for (int b = 0; b < kTile; ++b)
        if (b < count && row0 + r < t.inter)
          h[int64_t(first + b) * t.inter + row0 + r] = siluf_(ag[r][b]) * au[r][b];
}

// y[row] = h[row] · down_j for the item's rows.
template <WType T, bool kVector, int kTile>
__global__ __launch_bounds__(kSimtWarps * 32) void moe_down_simt(ExpertTable t, const float* __restrict__ h,
                                                                 const int32_t* __restrict__ items,
                                                                 const int32_t* __restrict__ num_items,
                                                                 float* __restrict__ y) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kSimtWarps + warp) * kSimtRows;
  if (row0 >= t.hidden) return;
  const WeightView d = expert_view(t, t.down, t.down_scale, e, t.hidden, t.inter);
  const float* hr[kTile];
#pragma unroll
  for (int b = 0; b < kTile; ++b) hr[b] = h + int64_t(first + imin(b, count - 1)) * t.inter;
  float acc[kSimtRows][kTile] = {};
  gemv_lane<T, kSimtRows, kTile, kVector>(hr, count, d, row0, acc);
  warp_reduce_all(acc, count);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
      for (int b = 0; b < kTile; ++b)
        if (b < count && row0 + r < t.hidden) y[int64_t(first + b) * t.hidden + row0 + r] = acc[r][b];
}

// ---- mid-size batches (tile 8, 16-byte rows)
// --------------------------------------------------------------- The SIMT kernels above give each warp 2
// rows and run gate and up as two passes over x; a batch of 64 tokens spreads its 512 pairs over nearly every
// expert, so the whole step streams ~1.3 GB of expert weights per layer and wants more bytes in flight per
// warp. Here a warp takes 2 gate rows and the 2 up rows beside them in one pass (4 weight loads per x load),
// and the down projection gives each row 8 lanes and each lane 2 rows of 8 vectors, so a lane has 16 loads in
// flight and a reduction spans 8 lanes instead of 32.
constexpr int kMidWarps = 8;
constexpr int kMidGateUpRows = 2;
constexpr int kMidDownLanes = 8;
constexpr int kMidDownRows = 2 * 32 / kMidDownLanes;  // per warp

template <WType T, int kTile>
__global__ __launch_bounds__(kMidWarps * 32) void moe_gate_up_mid(
    ExpertTable t, const float* __restrict__ x, int top_k, const int32_t* __restrict__ sorted,
    const int32_t* __restrict__ items, const int32_t* __restrict__ num_items, float* __restrict__ h) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kMidWarps + warp) * kMidGateUpRows;
  if (row0 >= t.inter) return;
  constexpr int V = W<T>::kVec, R = 2 * kMidGateUpRows;
  const int64_t K = t.hidden;
  const uint8_t* wrow[R];
  const float* srow[R];  // FP8: each row's block scales
  WeightView gv, uv;     // FP8: the scale layouts
  if constexpr (T == WType::FP8) {
    gv = expert_view(t, t.gate, t.gate_scale, e, t.inter, t.hidden);
    uv = expert_view(t, t.up, t.up_scale, e, t.inter, t.hidden);
  }
#pragma unroll
  for (int r = 0; r < kMidGateUpRows; ++r) {
    const int64_t row = imin<int64_t>(row0 + r, t.inter - 1);
    wrow[r] = static_cast<const uint8_t*>(t.gate[e]) + row * K * W<T>::kBytes;
    wrow[kMidGateUpRows + r] = static_cast<const uint8_t*>(t.up[e]) + row * K * W<T>::kBytes;
    if constexpr (T == WType::FP8)
      srow[r] = fp8_scale_row(gv, row), srow[kMidGateUpRows + r] = fp8_scale_row(uv, row);
  }
  const float* xr[kTile];
#pragma unroll
  for (int b = 0; b < kTile; ++b) xr[b] = x + int64_t(sorted[first + imin(b, count - 1)] / top_k) * K;
  float acc[R][kTile] = {};
#pragma unroll 4
  for (int64_t c = lane; c < K / V; c += 32) {
    float wv[R][V], sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      W<T>::load_vec(wrow[r] + c * V * W<T>::kBytes, wv[r]);
      if constexpr (T == WType::FP8) sc[r] = __ldg(srow[r] + ((int(c) * V) >> fp8_col_shift(gv)));
    }
    fma_tile<T == WType::FP8>(wv, sc, xr, c, count, acc);
  }
  warp_reduce_all(acc, count);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kMidGateUpRows; ++r)
#pragma unroll
      for (int b = 0; b < kTile; ++b)
        if (b < count && row0 + r < t.inter)
          h[int64_t(first + b) * t.inter + row0 + r] = siluf_(acc[r][b]) * acc[kMidGateUpRows + r][b];
}

template <WType T, int kTile>
__global__ __launch_bounds__(kMidWarps * 32) void moe_down_mid(ExpertTable t, const float* __restrict__ h,
                                                               const int32_t* __restrict__ items,
                                                               const int32_t* __restrict__ num_items,
                                                               float* __restrict__ y) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane / kMidDownLanes, sub = lane % kMidDownLanes;
  constexpr int V = W<T>::kVec, kGroups = 32 / kMidDownLanes;
  const int64_t K = t.inter;
  // This lane's two rows: group g of the warp's 8 takes rows g and g + 4.
  const int64_t base = (int64_t(blockIdx.x) * kMidWarps + warp) * kMidDownRows;
  if (base >= t.hidden) return;
  const int64_t rows[2] = {base + group, base + group + kGroups};
  const uint8_t* wrow[2];
  const float* srow[2];  // FP8
  WeightView sv;
  if constexpr (T == WType::FP8) sv = expert_view(t, t.down, t.down_scale, e, t.hidden, t.inter);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = imin<int64_t>(rows[r], t.hidden - 1);
    wrow[r] = static_cast<const uint8_t*>(t.down[e]) + row * K * W<T>::kBytes;
    if constexpr (T == WType::FP8) srow[r] = fp8_scale_row(sv, row);
  }
  const float* hr[kTile];
#pragma unroll
  for (int b = 0; b < kTile; ++b) hr[b] = h + int64_t(first + imin(b, count - 1)) * K;
  float acc[2][kTile] = {};
#pragma unroll 8
  for (int64_t c = sub; c < K / V; c += kMidDownLanes) {
    float wv[2][V], sc[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      W<T>::load_vec(wrow[r] + c * V * W<T>::kBytes, wv[r]);
      if constexpr (T == WType::FP8) sc[r] = __ldg(srow[r] + ((int(c) * V) >> fp8_col_shift(sv)));
    }
    fma_tile<T == WType::FP8>(wv, sc, hr, c, count, acc);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int b = 0; b < kTile; ++b)
      if (b < count)
#pragma unroll
        for (int o = kMidDownLanes / 2; o > 0; o >>= 1)
          acc[r][b] += __shfl_xor_sync(0xffffffffu, acc[r][b], o);
  if (sub == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int b = 0; b < kTile; ++b)
        if (b < count && rows[r] < t.hidden) y[int64_t(first + b) * t.hidden + rows[r]] = acc[r][b];
}

// ---- mid-size batches on tensor cores (FP8 and bf16 weights)
// ------------------------------------------------ The kernels above do every product as a float32 FMA: from
// 9 tokens they are bound by FMA issue, not by bytes (FP8, twice the products per byte plus the conversions,
// came out slower than bf16; bf16 with a routing that gives experts several tokens each took 230 us per layer
// at batch 16, FP8 here 53). Here a work item's ≤ 8 rows are the n8 tile of mma.sync (mma_fp8.cuh): a warp
// takes 32 gate rows and the 32 up rows beside them (so silu(gate) * up is formed in registers), or 32 down
// rows, and the warps of a block split the 128-column chunks; their sums are added in warp order through
// shared memory. The activations go in as one bf16 term, or three (float32 accuracy, as the SIMT path) in
// exact mode; h stays float32.
constexpr int kMoeMmaGateUpSplits = 4, kMoeMmaDownSplits = 2;

bool moe_items_mma_enabled() {
  static const bool on = [] {
    const char* e =
        std::getenv("MOESERVE_CUDA_MOE_ITEMS_MMA");  // 0: the SIMT mid-size kernels (for comparison)
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// FP8 weights in 128-column blocks (one scale per chunk), or bf16; rows and columns in whole chunks.
bool moe_items_mma_supported(const ExpertTable& t) {
  const bool shape = t.hidden % kMmaChunk == 0 && t.inter % kMmaChunk == 0;
  if (t.type == WType::BF16) return shape;
  return t.type == WType::FP8 && shape && t.block_cols == kMmaChunk && t.block_rows % kMmaWarpRows == 0 &&
         t.gate_scale && t.up_scale && t.down_scale;
}

// Bytes per weight element of the MMA item kernels.
template <WType T>
constexpr int64_t mma_elem_bytes() {
  return T == WType::FP8 ? 1 : 2;
}

// The bf16 counterpart of load_w_fragment + mma_chunk (mma_fp8.cuh), one 64-column half at a time: the
// thread's columns 64h + 16q + [0, 16) of rows g + 8i are 32 bytes, two 16-byte loads, whose eight words are
// the bf16 pairs p = 0..7 that the FP8 layout forms by conversion (so the activation fragments are the same).
// By halves, the fragments of gate and up take the registers FP8's whole chunk does.
template <int kNT, int kTerms>
__device__ __forceinline__ void mma_chunk_bf16(const uint8_t* const (&wp)[4], int64_t k0,
                                               const uint32_t (&xf)[kNT][kTerms][2][8],
                                               float (&part)[2][kNT][4]) {
  auto word = [](const uint4(&w)[2], int p) {
    const uint4& u = w[p >> 2];
    return (p & 3) == 0 ? u.x : (p & 3) == 1 ? u.y : (p & 3) == 2 ? u.z : u.w;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint4 wv[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const auto* at = reinterpret_cast<const uint4*>(wp[i] + 2 * (k0 + 64 * h));
      wv[i][0] = __ldg(at), wv[i][1] = __ldg(at + 1);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int p = 2 * s;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t a0 = word(wv[2 * m], p), a1 = word(wv[2 * m + 1], p);
        const uint32_t a2 = word(wv[2 * m], p + 1), a3 = word(wv[2 * m + 1], p + 1);
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int t = 0; t < kTerms; ++t)
            mma_bf16(part[m][j], a0, a1, a2, a3, xf[j][t][h][p], xf[j][t][h][p + 1]);
      }
    }
  }
}

// The block's warps' accumulators (kVals per lane) summed in warp order into warp 0's; other warps return
// false.
template <int kVals>
__device__ __forceinline__ bool reduce_warps(float (&v)[kVals], float (*red)[kVals][32]) {
  const int splits = int(blockDim.x >> 5), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (splits == 1) return true;
#pragma unroll
  for (int i = 0; i < kVals; ++i) red[warp][i][lane] = v[i];
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    float s = red[0][i][lane];
    for (int w = 1; w < splits; ++w) s += red[w][i][lane];
    v[i] = s;
  }
  return true;
}

// kNT token tiles of 8: a work item's ≤ 8 kNT rows share each weight fragment (kNT 2: items of 16, when most
// experts get more than 8 tokens, as at decode batch 256, halving the expert re-reads). kTerms: the
// activations as three bf16 terms in exact mode (float32 accuracy), else one, as the grouped GEMM and cuBLAS
// round them: three made the kernels MMA-bound (2,048 pairs: 571 vs 533 us with items of 16).
template <WType T, int kNT, int kTerms>
__global__ __launch_bounds__(kMoeMmaGateUpSplits * 32) void moe_gate_up_mma(
    ExpertTable t, const float* __restrict__ x, int top_k, const int32_t* __restrict__ sorted,
    const int32_t* __restrict__ items, const int32_t* __restrict__ num_items, float* __restrict__ h) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int splits = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t row_base = int64_t(blockIdx.x) * kMmaWarpRows, K = t.hidden;
  const WeightView gv = expert_view(t, t.gate, t.gate_scale, e, t.inter, t.hidden);
  const WeightView uv = expert_view(t, t.up, t.up_scale, e, t.inter, t.hidden);
  constexpr int64_t B = mma_elem_bytes<T>();
  const uint8_t *gp[4], *up[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = imin<int64_t>(row_base + g + 8 * i, t.inter - 1);
    gp[i] = static_cast<const uint8_t*>(gv.data) + (row * K + 16 * q) * B;
    up[i] = static_cast<const uint8_t*>(uv.data) + (row * K + 16 * q) * B;
  }
  const bool fp8 = T == WType::FP8;
  const float *gs = fp8 ? fp8_scale_row(gv, row_base) : nullptr,
              *us = fp8 ? fp8_scale_row(uv, row_base) : nullptr;
  const float* xr[kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) xr[j] = x + int64_t(sorted[first + imin(g + 8 * j, count - 1)] / top_k) * K;
  float ag[2][kNT][4] = {}, au[2][kNT][4] = {};
  for (int c = warp; c < int(K / kMmaChunk); c += splits) {
    const int64_t k0 = int64_t(c) * kMmaChunk;
    uint32_t xf[kNT][kTerms][2][8];
    float pg[2][kNT][4] = {}, pu[2][kNT][4] = {};
    if constexpr (T == WType::FP8) {
      uint4 wg[4][2], wu[4][2];
      load_w_fragment(gp, k0, wg);
      load_w_fragment(up, k0, wu);
#pragma unroll
      for (int j = 0; j < kNT; ++j) load_x_fragment<kTerms>(xr[j], k0, q, g + 8 * j < count, xf[j]);
      mma_chunk<kNT, kTerms>(wg, xf, pg);
      mma_chunk<kNT, kTerms>(wu, xf, pu);
    } else {
#pragma unroll
      for (int j = 0; j < kNT; ++j) load_x_fragment<kTerms>(xr[j], k0, q, g + 8 * j < count, xf[j]);
      mma_chunk_bf16<kNT, kTerms>(gp, k0, xf, pg);
      mma_chunk_bf16<kNT, kTerms>(up, k0, xf, pu);
    }
    const float sg = fp8 ? __ldg(gs + c) : 1.0f, su = fp8 ? __ldg(us + c) : 1.0f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ag[m][j][i] = fmaf(sg, pg[m][j][i], ag[m][j][i]), au[m][j][i] = fmaf(su, pu[m][j][i], au[m][j][i]);
  }
  constexpr int kVals = 8 * kNT;  // per lane: 2 m tiles x kNT token tiles x 4
  __shared__ float red[kMoeMmaGateUpSplits][2 * kVals][32];
  float v[2 * kVals];
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    const int m = i / (4 * kNT), j = (i / 4) % kNT;
    v[i] = ag[m][j][i % 4], v[kVals + i] = au[m][j][i % 4];
  }
  if (!reduce_warps<2 * kVals>(v, red)) return;
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    const int m = i / (4 * kNT), j = (i / 4) % kNT;
    const int64_t row = row_base + 16 * m + g + 8 * ((i % 4) >> 1);
    const int b = 8 * j + 2 * q + (i & 1);
    if (row < t.inter && b < count) h[int64_t(first + b) * t.inter + row] = siluf_(v[i]) * v[kVals + i];
  }
}

template <WType T, int kNT, int kTerms>
__global__ __launch_bounds__(kMoeMmaDownSplits * 32) void moe_down_mma(ExpertTable t,
                                                                       const float* __restrict__ h,
                                                                       const int32_t* __restrict__ items,
                                                                       const int32_t* __restrict__ num_items,
                                                                       float* __restrict__ y) {
  pdl_begin();
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int splits = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t row_base = int64_t(blockIdx.x) * kMmaWarpRows, K = t.inter;
  const WeightView dv = expert_view(t, t.down, t.down_scale, e, t.hidden, t.inter);
  constexpr int64_t B = mma_elem_bytes<T>();
  const uint8_t* dp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    dp[i] = static_cast<const uint8_t*>(dv.data) +
            (imin<int64_t>(row_base + g + 8 * i, t.hidden - 1) * K + 16 * q) * B;
  const bool fp8 = T == WType::FP8;
  const float* ds = fp8 ? fp8_scale_row(dv, row_base) : nullptr;
  const float* hr[kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) hr[j] = h + int64_t(first + imin(g + 8 * j, count - 1)) * K;
  float acc[2][kNT][4] = {};
  for (int c = warp; c < int(K / kMmaChunk); c += splits) {
    const int64_t k0 = int64_t(c) * kMmaChunk;
    uint32_t xf[kNT][kTerms][2][8];
    float part[2][kNT][4] = {};
    if constexpr (T == WType::FP8) {
      uint4 wd[4][2];
      load_w_fragment(dp, k0, wd);
#pragma unroll
      for (int j = 0; j < kNT; ++j) load_x_fragment<kTerms>(hr[j], k0, q, g + 8 * j < count, xf[j]);
      mma_chunk<kNT, kTerms>(wd, xf, part);
    } else {
#pragma unroll
      for (int j = 0; j < kNT; ++j) load_x_fragment<kTerms>(hr[j], k0, q, g + 8 * j < count, xf[j]);
      mma_chunk_bf16<kNT, kTerms>(dp, k0, xf, part);
    }
    const float sc = fp8 ? __ldg(ds + c) : 1.0f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][j][i] = fmaf(sc, part[m][j][i], acc[m][j][i]);
  }
  constexpr int kVals = 8 * kNT;
  __shared__ float red[kMoeMmaDownSplits][kVals][32];
  float v[kVals];
#pragma unroll
  for (int i = 0; i < kVals; ++i) v[i] = acc[i / (4 * kNT)][(i / 4) % kNT][i % 4];
  if (!reduce_warps<kVals>(v, red)) return;
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    const int m = i / (4 * kNT), j = (i / 4) % kNT;
    const int64_t row = row_base + 16 * m + g + 8 * ((i % 4) >> 1);
    const int b = 8 * j + 2 * q + (i & 1);
    if (row < t.hidden && b < count) y[int64_t(first + b) * t.hidden + row] = v[i];
  }
}

bool moe_mid_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOESERVE_CUDA_MOE_MID");  // 0: the two-row SIMT kernels (for comparison)
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// out[t] = Σ_j w_j y[row_j], j in ascending expert id; y float32, or bf16 (the cuBLAS experts).
template <typename Y>
__global__ void moe_combine_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                                   const int32_t* __restrict__ pair_row, int k, const Y* __restrict__ y,
                                   int64_t H, float* __restrict__ out) {
  pdl_begin();
  __shared__ int32_t s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int32_t id[kMaxTopK];
    for (int j = 0; j < k; ++j) {
      int32_t e = ids[t * k + j], r = pair_row[t * k + j];
      float w = weights[t * k + j];
      int i = j;
      for (; i > 0 && id[i - 1] > e; --i) id[i] = id[i - 1], s_row[i] = s_row[i - 1], s_w[i] = s_w[i - 1];
      id[i] = e, s_row[i] = r, s_w[i] = w;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = fmaf(s_w[j], float(y[int64_t(s_row[j]) * H + c]), acc);
    out[t * H + c] = acc;
  }
}

template <WType T>
void run_experts(const ExpertTable& t, const float* x, int64_t n, int top_k, bool tensor_cores, int tile,
                 bool exact, int64_t max_items, const MoeScratch& s, cudaStream_t stream) {
  if (tensor_cores) {
    launch_moe_grouped_mma(t, x, n, top_k, max_items, s, stream);
    return;
  }
  const bool vec = (t.hidden % W<T>::kVec == 0) && (t.inter % W<T>::kVec == 0) &&
                   (T != WType::FP8 || (t.block_cols % W<T>::kVec == 0 && is_pow2(t.block_cols)));
  if (moe_items_pipe_used(t, tile, false, exact)) {
    launch_moe_items_pipe(t, x, n, top_k, tile, max_items, s, stream);
    return;
  }
  if constexpr (T == WType::FP8 || T == WType::BF16) {
    if ((tile == kMoeSimtTile || tile == kMoeMmaMidTile) && moe_items_mma_supported(t) &&
        moe_items_mma_enabled()) {
      const dim3 g1(blocks_for(t.inter, kMmaWarpRows), unsigned(max_items));
      const dim3 g2(blocks_for(t.hidden, kMmaWarpRows), unsigned(max_items));
      const int s1 = int(imin<int64_t>(kMoeMmaGateUpSplits, t.hidden / kMmaChunk));
      const int s2 = int(imin<int64_t>(kMoeMmaDownSplits, t.inter / kMmaChunk));
      float* h = static_cast<float*>(s.h);
      auto launch = [&](auto token_tiles, auto terms) {
        constexpr int NT = decltype(token_tiles)::value, Terms = decltype(terms)::value;
        launch_k(moe_gate_up_mma<T, NT, Terms>, g1, 32 * s1, 0, stream, t, x, top_k, s.sorted, s.items,
                 s.num_items, h);
        launch_k(moe_down_mma<T, NT, Terms>, g2, 32 * s2, 0, stream, t, static_cast<const float*>(h), s.items,
                 s.num_items, s.y);
      };
      using One = std::integral_constant<int, 1>;
      if (tile == kMoeMmaMidTile)  // never in exact mode (moe_tile)
        launch(std::integral_constant<int, kMoeMmaMidTile / 8>{}, One{});
      else if (exact)
        launch(One{}, std::integral_constant<int, 3>{});
      else
        launch(One{}, One{});
      return;
    }
  }
  {
    if (vec && tile == kMoeSimtTile && moe_mid_enabled()) {
      const dim3 g1(blocks_for(t.inter, kMidWarps * kMidGateUpRows), unsigned(max_items));
      const dim3 g2(blocks_for(t.hidden, kMidWarps * kMidDownRows), unsigned(max_items));
      float* h = static_cast<float*>(s.h);
      launch_k(moe_gate_up_mid<T, kMoeSimtTile>, g1, kMidWarps * 32, 0, stream, t, x, top_k, s.sorted,
               s.items, s.num_items, h);
      launch_k(moe_down_mid<T, kMoeSimtTile>, g2, kMidWarps * 32, 0, stream, t, static_cast<const float*>(h),
               s.items, s.num_items, s.y);
      return;
    }
  }
  const int rows_per_block = kSimtWarps * kSimtRows;
  const dim3 g1(blocks_for(t.inter, rows_per_block), unsigned(max_items));
  const dim3 g2(blocks_for(t.hidden, rows_per_block), unsigned(max_items));
  float* h = static_cast<float*>(s.h);
  auto launch = [&](auto vector, auto rows) {
    constexpr bool V = decltype(vector)::value;
    constexpr int Tile = decltype(rows)::value;
    launch_k(moe_gate_up_simt<T, V, Tile>, g1, kSimtWarps * 32, 0, stream, t, x, top_k, s.sorted, s.items,
             s.num_items, h);
    launch_k(moe_down_simt<T, V, Tile>, g2, kSimtWarps * 32, 0, stream, t, h, s.items, s.num_items, s.y);
  };
  using One = std::integral_constant<int, 1>;
  using Full = std::integral_constant<int, kMoeSimtTile>;
  if (vec) {
    if (tile == 1)
      launch(std::true_type{}, One{});
    else
      launch(std::true_type{}, Full{});
  } else {
    if (tile == 1)
      launch(std::false_type{}, One{});
    else
      launch(std::false_type{}, Full{});
  }
}

// ---- decode path (few tokens): no grouping, the shared expert and the combine fused
// ------------------------ gate/up: blockIdx.y = pair p < P (expert ids[p], token p / top_k) or P + t (token
// t's shared expert); one warp per row (two for FP8, below), h rows per pair (routed) and hs rows per token
// (shared).
constexpr int kDecodeWarps = 8;

// The products of one 16-byte weight vector (chunk c of the row) with x, summed; FP8 callers apply the
// vector's block scale to the sum.
template <WType T>
__device__ __forceinline__ float dot_vec(const uint8_t* wrow, int64_t c, const float* __restrict__ x) {
  constexpr int V = W<T>::kVec;
  float wv[V];
  W<T>::load_vec(wrow + c * V * W<T>::kBytes, wv);
  const float4* xp = reinterpret_cast<const float4*>(x + c * V);
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < V / 4; ++e) {
    const float4 f = __ldg(xp + e);
    acc = fmaf(wv[4 * e], f.x, acc);
    acc = fmaf(wv[4 * e + 1], f.y, acc);
    acc = fmaf(wv[4 * e + 2], f.z, acc);
    acc = fmaf(wv[4 * e + 3], f.w, acc);
  }
  return acc;
}

// R: rows per warp of the decode gate/up kernel (FP8: 1 or 2, below; 16-bit: 1).
template <WType T, int R>
__global__ __launch_bounds__(kDecodeWarps *
                             32) void moe_decode_gate_up(ExpertTable t, WeightView sg, WeightView su,
                                                         const float* __restrict__ x, int top_k, int64_t P,
                                                         const int32_t* __restrict__ ids,
                                                         float* __restrict__ h, float* __restrict__ hs) {
  const bool shared = int64_t(blockIdx.y) >= P;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = (int64_t(blockIdx.x) * kDecodeWarps + warp) * R;  // this warp's first row
  if (shared && threadIdx.x == 0 && int64_t(blockIdx.y) == P) {         // weights known before the routing is
    const int64_t r0 = int64_t(blockIdx.x) * kDecodeWarps * R;
    const int64_t rows = imin<int64_t>(kDecodeWarps * R, sg.rows - r0);
    if (rows > 0) {
      const uint32_t bytes = uint32_t(rows * sg.cols * W<T>::kBytes);
      prefetch_l2(static_cast<const uint8_t*>(sg.data) + r0 * sg.cols * W<T>::kBytes, bytes);
      prefetch_l2(static_cast<const uint8_t*>(su.data) + r0 * su.cols * W<T>::kBytes, bytes);
    }
  }
  pdl_begin();
  WeightView g, u;
  const float* xr;
  float* out;
  if (!shared) {
    const int64_t p = blockIdx.y;
    const int e = ids[p];
    g = expert_view(t, t.gate, t.gate_scale, e, t.inter, t.hidden);
    u = expert_view(t, t.up, t.up_scale, e, t.inter, t.hidden);
    xr = x + (p / top_k) * t.hidden;
    out = h + p * t.inter;
  } else {
    const int64_t tok = int64_t(blockIdx.y) - P;
    g = sg, u = su;
    xr = x + tok * t.hidden;
    out = hs + tok * sg.rows;
  }
  if (row >= g.rows) return;
  if constexpr (T != WType::FP8) {
    const auto* gp = static_cast<const uint8_t*>(g.data) + row * g.cols * W<T>::kBytes;
    const auto* up = static_cast<const uint8_t*>(u.data) + row * u.cols * W<T>::kBytes;
    const int64_t chunks = g.cols / W<T>::kVec;
    float ag = 0.0f, au = 0.0f;
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += 32) {
      ag += dot_vec<T>(gp, c, xr);
      au += dot_vec<T>(up, c, xr);
    }
    ag = warp_sum(ag), au = warp_sum(au);
    if (lane == 0) out[row] = siluf_(ag) * au;
  } else {
    // R rows of gate and of up per warp, one x vector per chunk; each vector's sum scaled once.
    constexpr int V = W<T>::kVec;
    const int chunks = int(g.cols / V), shift = fp8_col_shift(g);
    const uint8_t *gp[R], *up[R];
    const float *gs[R], *us[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t rr = imin<int64_t>(row + r, g.rows - 1);
      gp[r] = static_cast<const uint8_t*>(g.data) + rr * g.cols;
      up[r] = static_cast<const uint8_t*>(u.data) + rr * u.cols;
      gs[r] = fp8_scale_row(g, rr), us[r] = fp8_scale_row(u, rr);
    }
    float ag[R] = {}, au[R] = {};
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      float xv[V];
      load_x_vec(xr, c, xv);
      float wg[R][V], wu[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) W<T>::load_vec(gp[r] + c * V, wg[r]), W<T>::load_vec(up[r] + c * V, wu[r]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float pg = 0.0f, pu = 0.0f;
#pragma unroll
        for (int q = 0; q < V; ++q) pg = fmaf(wg[r][q], xv[q], pg), pu = fmaf(wu[r][q], xv[q], pu);
        const int sc = (c * V) >> shift;
        ag[r] = fmaf(__ldg(gs[r] + sc), pg, ag[r]);
        au[r] = fmaf(__ldg(us[r] + sc), pu, au[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) ag[r] = warp_sum(ag[r]), au[r] = warp_sum(au[r]);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row + r < g.rows) out[row + r] = siluf_(ag[r]) * au[r];
  }
}

// out[t][r] = Σ_j w_j (h_j · down_{e_j}[r]) over token t's pairs + sigmoid(gate_logit[t]) (hs_t · sd[r]);
// kDownWarpsPerRow warps per output row, the (pair, column chunk) units spread over their lanes (more loads
// in flight than one warp per row), partial sums added in warp order (kWpr: 4, or 2 for FP8, below).
template <WType T, int kWpr>
__global__ __launch_bounds__(kDecodeWarps * 32) void moe_decode_down(
    ExpertTable t, WeightView sd, const float* __restrict__ gate_logit, int top_k,
    const int32_t* __restrict__ ids, const float* __restrict__ weights, const float* __restrict__ h,
    const float* __restrict__ hs, float* __restrict__ out) {
  constexpr int kRowsPerBlock = kDecodeWarps / kWpr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t r = r0 + warp / kWpr;
  const int part = warp % kWpr;
  // Before pdl_wait: the routing (written two kernels back, by the route kernel: complete once this kernel
  // runs, see common.cuh) and L2 prefetches of this block's rows of the chosen experts and the shared expert,
  // so that the down weights stream in while gate/up still runs.
  __shared__ const uint8_t* s_w[kMaxTopK];
  __shared__ const float* s_scale[kMaxTopK];
  __shared__ float s_weight[kMaxTopK];
  __shared__ int32_t s_pair[kMaxTopK];
  __shared__ float s_part[kDecodeWarps];
  const int64_t tok = blockIdx.y;
  const int64_t rows = imin<int64_t>(kRowsPerBlock, t.hidden - r0);
  if (threadIdx.x < top_k) {  // this pair's rank among the token's experts in ascending id
    const int j = threadIdx.x;
    const int e = ids[tok * top_k + j];
    int rank = 0;
    for (int i = 0; i < top_k; ++i) rank += ids[tok * top_k + i] < e;
    const auto* wd = static_cast<const uint8_t*>(t.down[e]);
    s_w[rank] = wd;
    s_scale[rank] = t.down_scale ? t.down_scale[e] : nullptr;
    s_weight[rank] = weights[tok * top_k + j];
    s_pair[rank] = int32_t(tok * top_k + j);
    if (rows > 0) prefetch_l2(wd + r0 * t.inter * W<T>::kBytes, uint32_t(rows * t.inter * W<T>::kBytes));
  }
  if (sd.data && threadIdx.x == 32 && blockIdx.y == 0 && rows > 0)
    prefetch_l2(static_cast<const uint8_t*>(sd.data) + r0 * sd.cols * W<T>::kBytes,
                uint32_t(rows * sd.cols * W<T>::kBytes));
  pdl_begin();
  __syncthreads();
  constexpr int V = W<T>::kVec;
  constexpr int kStride = 32 * kWpr;
  float acc = 0.0f;
  if (r < t.hidden) {
    if constexpr (T != WType::FP8) {
      const int64_t chunks = t.inter / V, units = top_k * chunks;
#pragma unroll 4
      for (int64_t u = part * 32 + lane; u < units; u += kStride) {
        const int j = int(u / chunks);
        const int64_t c = u - j * chunks;
        acc = fmaf(s_weight[j],
                   dot_vec<T>(s_w[j] + r * t.inter * W<T>::kBytes, c, h + int64_t(s_pair[j]) * t.inter), acc);
      }
    } else {
      const int chunks = int(t.inter / V), units = top_k * chunks, shift = __ffs(t.block_cols) - 1;
      const int64_t srow = int64_t(int(r) / t.block_rows) * ((t.inter + t.block_cols - 1) / t.block_cols);
#pragma unroll 4
      for (int u = part * 32 + lane; u < units; u += kStride) {
        const int j = u / chunks, c = u - j * chunks;
        const float sc = __ldg(s_scale[j] + srow + ((c * V) >> shift));
        acc = fmaf(s_weight[j] * sc, dot_vec<T>(s_w[j] + r * t.inter, c, h + int64_t(s_pair[j]) * t.inter),
                   acc);
      }
    }
    if (sd.data) {
      const float gs = sigmoidf_(gate_logit[tok]);
      const auto* wrow = static_cast<const uint8_t*>(sd.data) + r * sd.cols * W<T>::kBytes;
      const float* hr = hs + tok * sd.cols;
      float a = 0.0f;
      if constexpr (T != WType::FP8) {
#pragma unroll 4
        for (int64_t c = part * 32 + lane; c < sd.cols / V; c += kStride) a += dot_vec<T>(wrow, c, hr);
      } else {
        const float* ss = fp8_scale_row(sd, r);
        const int shift = fp8_col_shift(sd);
#pragma unroll 4
        for (int c = part * 32 + lane; c < int(sd.cols / V); c += kStride)
          a = fmaf(__ldg(ss + ((c * V) >> shift)), dot_vec<T>(wrow, c, hr), a);
      }
      acc = fmaf(gs, a, acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) s_part[warp] = acc;
  __syncthreads();
  if (part == 0 && lane == 0 && r < t.hidden) {
    float total = 0.0f;
    for (int p = 0; p < kWpr; ++p) total += s_part[warp + p];
    out[tok * t.hidden + r] = total;
  }
}

template <WType T>
bool decode_vectors(const ExpertTable& t, const MoeDecodeShared& sh) {
  constexpr int V = W<T>::kVec;
  bool ok = t.hidden % V == 0 && t.inter % V == 0 &&
            (T != WType::FP8 || (t.block_cols % V == 0 && is_pow2(t.block_cols)));
  if (sh.down.data) ok = ok && vector_rows<T>(sh.gate) && vector_rows<T>(sh.up) && vector_rows<T>(sh.down);
  return ok;
}

}  // namespace

bool moe_items_pipe_used(const ExpertTable& t, int tile, bool tensor_cores, bool exact) {
  return !tensor_cores && !exact &&
         (tile == kMoeSimtTile || tile == kMoeMmaMidTile || tile == kMoeMmaWideTile) &&
         moe_items_mma_supported(t) && moe_items_pipe_supported(t) && moe_items_mma_enabled() &&
         moe_items_pipe_enabled();
}

// H200, 35B-A3B experts (cuda_ops_bench moe, uniform routing, µs, pipelined items vs grouped GEMM): bf16 512
// tokens (4,096 pairs) 482 vs 549, 1,024 654 vs 587; FP8 1,024 541 vs 617, 2,048 925 vs 906. The register-fed
// items (moe.cu) lost to the grouped GEMM from 4,096 pairs.
int64_t moe_grouped_min_pairs(const ExpertTable& t) {
  static const char* env = std::getenv("MOESERVE_CUDA_MOE_MMA_MIN_PAIRS");
  if (env) return std::atoll(env);
  const bool chunks = t.hidden % kMmaChunk == 0 && t.inter % kMmaChunk == 0;
  const bool pipelined = moe_items_mma_enabled() && moe_items_pipe_enabled() &&
                         ((t.type == WType::BF16 && chunks) || moe_fp8_activations(t));
  if (!pipelined) return 4096;
  // FP8 on wgmma (wgmma_available): items 268 / 347 / 547 µs at 256 / 512 / 1,024 tokens, grouped 303 / 323
  // / 360 (and 530 at 2,048, where the mma.sync grouped kernel took 906).
  if (t.type == WType::FP8) return wgmma_available() ? 4096 : 12288;
  return 6144;
}

int moe_tile(const ExpertTable& t, int64_t n, int top_k, bool tensor_cores, bool exact) {
  if (tensor_cores) return kMoeMmaTile;
  const int64_t pairs = n * top_k;
  // Few pairs per expert (decode): one row per work item, so no warp reduces accumulators it does not use.
  if (pairs <= 2 * int64_t(t.experts) / 8) return 1;
  // MMA items of 16 rows (activations rounded to bf16 once) once an expert averages 6 tokens: most would
  // otherwise take two items of 8, each streaming the expert's weights again.
  if (!exact && pairs >= 6 * int64_t(t.experts) && moe_items_mma_supported(t) && moe_items_mma_enabled()) {
    // The pipelined items take 32 rows once an expert averages 24: each weight fragment then serves four
    // token tiles, and fewer items stream the same expert again.
    const bool wide = pairs >= moe_wide_items_min_pairs_per_expert() * int64_t(t.experts) &&
                      moe_items_pipe_supported(t) && moe_items_pipe_enabled();
    return wide ? kMoeMmaWideTile : kMoeMmaMidTile;
  }
  return kMoeSimtTile;
}

int64_t moe_max_items(int64_t pairs, int experts, int tile) {
  return std::min<int64_t>(pairs, (pairs + tile - 1) / tile + std::min<int64_t>(experts, pairs));
}

void launch_moe_route(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize,
                      int64_t n, int tile, const MoeScratch& s, cudaStream_t stream) {
  const int64_t P = n * top_k;
  if (n <= kFusedRouteMaxTokens) {
    launch_k(moe_route_plan_kernel, 1, 1024, 0, stream, router_logits, n, t.experts, top_k, renormalize, tile,
             s.ids, s.weights, s.sorted, s.pair_row, s.items, s.num_items);
  } else {
    launch_k(moe_route_kernel, blocks_for(n * 32, 256), 256, 0, stream, router_logits, n, t.experts, top_k,
             renormalize, s.ids, s.weights);
    launch_k(moe_plan_kernel, 1, 1024, 0, stream, s.ids, P, t.experts, tile, s.sorted, s.pair_row, s.items,
             s.num_items);
  }
}

void launch_moe_combine(const ExpertTable& t, int64_t n, int top_k, const MoeScratch& s, bool bf16_y,
                        float* out, cudaStream_t stream) {
  if (bf16_y)
    launch_k(moe_combine_kernel<__nv_bfloat16>, unsigned(n), 256, 0, stream, s.ids, s.weights, s.pair_row,
             top_k, reinterpret_cast<const __nv_bfloat16*>(s.y), t.hidden, out);
  else
    launch_k(moe_combine_kernel<float>, unsigned(n), 256, 0, stream, s.ids, s.weights, s.pair_row, top_k,
             static_cast<const float*>(s.y), t.hidden, out);
}

void launch_moe(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize, const float* x,
                int64_t n, int tile, bool tensor_cores, bool exact, const MoeScratch& s, float* out,
                cudaStream_t stream) {
  if (n == 0) return;
  const int64_t P = n * top_k;
  launch_moe_route(t, router_logits, top_k, renormalize, n, tile, s, stream);
  const int64_t max_items = moe_max_items(P, t.experts, tile);
  MOESERVE_DISPATCH_WTYPE(t.type, T,
                          run_experts<T>(t, x, n, top_k, tensor_cores, tile, exact, max_items, s, stream));
  launch_moe_combine(t, n, top_k, s, false, out, stream);
}

}  // namespace moeserve::cuda

namespace moeserve::cuda {

bool moe_decode_supported(const ExpertTable& t, int top_k, const MoeDecodeShared& sh) {
  if (top_k > kMaxTopK || t.type == WType::F32) return false;
  if (sh.down.data &&
      (sh.gate.type != t.type || sh.up.type != t.type || sh.down.type != t.type || sh.gate.cols != t.hidden ||
       sh.down.rows != t.hidden || sh.up.rows != sh.gate.rows || sh.down.cols != sh.gate.rows))
    return false;
  bool ok = false;
  MOESERVE_DISPATCH_WTYPE(t.type, T, ok = decode_vectors<T>(t, sh));
  return ok;
}

void launch_moe_decode(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize,
                       const float* x, int64_t n, const MoeDecodeShared& sh, const MoeScratch& s, float* out,
                       cudaStream_t stream) {
  if (n == 0) return;
  const int64_t P = n * top_k;
  launch_k(moe_route_kernel, blocks_for(n * 32, 256), 256, 0, stream, router_logits, n, t.experts, top_k,
           renormalize, s.ids, s.weights);
  const bool shared = sh.down.data != nullptr;
  const int64_t rows = std::max<int64_t>(t.inter, shared ? sh.gate.rows : 0);
  float* h = static_cast<float*>(s.h);
  // Warp shapes: (rows per gate/up warp, warps per down row). 16-bit: (1, 4). FP8 rows hold half the bytes:
  // (2, 2) gives a warp as many bytes and loads in flight as at 16 bits (and each x vector serves four weight
  // vectors), but half as many warps; MOESERVE_CUDA_MOE_FP8_DECODE=1 takes (1, 4) (for measuring).
  auto go = [&](auto type, auto rows_per_warp, auto warps_per_row) {
    constexpr WType T = decltype(type)::value;
    constexpr int R = decltype(rows_per_warp)::value, Wpr = decltype(warps_per_row)::value;
    const dim3 g1(blocks_for(rows, kDecodeWarps * R), unsigned(P + (shared ? n : 0)));
    const dim3 g2(blocks_for(t.hidden, kDecodeWarps / Wpr), unsigned(n));
    launch_k(moe_decode_gate_up<T, R>, g1, kDecodeWarps * 32, 0, stream, t, sh.gate, sh.up, x, top_k, P,
             s.ids, h, sh.h);
    launch_k(moe_decode_down<T, Wpr>, g2, kDecodeWarps * 32, 0, stream, t, sh.down, sh.gate_logit, top_k,
             s.ids, s.weights, h, sh.h, out);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if (t.type == WType::FP8) {
    static const bool wide = [] {
      const char* e = std::getenv("MOESERVE_CUDA_MOE_FP8_DECODE");
      return e && std::strcmp(e, "1") == 0;
    }();
    if (wide)
      go(std::integral_constant<WType, WType::FP8>{}, One{}, Four{});
    else
      go(std::integral_constant<WType, WType::FP8>{}, Two{}, Two{});
  } else {
    MOESERVE_DISPATCH_WTYPE(
        t.type, T, if constexpr (T != WType::FP8) go(std::integral_constant<WType, T>{}, One{}, Four{}));
  }
}

}  // namespace moeserve::cuda
