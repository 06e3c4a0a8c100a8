// The routed-expert path, with no host synchronisation (so a decode step can be recorded as a CUDA graph):
//   route   — per token: softmax over the router logits, top-k (ties to the lower id), renormalised weights
//   plan    — one block groups the (token, expert) pairs by expert and cuts each expert's rows into work
//             items of at most `tile` rows; the item count stays on the device
//   experts — gate/up then down over every item: a grid sized for the most items there can be, whose extra
//             blocks exit. SIMT GEMV-style kernels with float32 activations for small batches (and exact
//             mode), bf16 tensor-core (WMMA) tiles of 64 rows for large ones
//   combine — per token, Σ_k w_k · y_k in ascending expert id, as the CPU (and HF) accumulate.
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/gemv.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr int kPerLane = kMaxExperts / 32;

// One warp routes one token.
__device__ __forceinline__ void route_token(const float* __restrict__ logits, int64_t row, int E, int k,
                                            bool renormalize, int32_t* __restrict__ ids,
                                            float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  const float* l = logits + row * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float total = 0.0f;
  for (int e = lane; e < E; e += 32) total += expf(l[e] - mx);
  total = warp_sum(total);
  float p[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? expf(l[e] - mx) / total : -1.0f;  // taken and absent experts read as -1
  }
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
  plan_block(ids, P, E, tile, sorted, pair_row, items, num_items);
}

// Small batches: routing and planning in one launch (one block; warp w routes tokens w, w+32, ...).
constexpr int64_t kFusedRouteMaxTokens = 256;
__global__ void moe_route_plan_kernel(const float* __restrict__ logits, int64_t n, int E, int k,
                                      bool renormalize, int tile, int32_t* __restrict__ ids,
                                      float* __restrict__ weights, int32_t* __restrict__ sorted,
                                      int32_t* __restrict__ pair_row, int32_t* __restrict__ items,
                                      int32_t* __restrict__ num_items) {
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

// ---- tensor-core path ----------------------------------------------------------------------------------
namespace wmma = nvcuda::wmma;
constexpr int kMmaN = 64, kMmaK = 32, kMmaLd = kMmaK + 8, kMmaThreads = 128, kCLd = kMmaN + 4;

__global__ void moe_gather_bf16(const float* __restrict__ x, int64_t P, int64_t H, int top_k,
                                const int32_t* __restrict__ sorted, __nv_bfloat16* __restrict__ xb) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= P * H) return;
  const int64_t row = i / H, c = i % H;
  xb[i] = __float2bfloat16_rn(x[int64_t(sorted[row] / top_k) * H + c]);
}

// 16 bytes of weight row `row`, columns [k, k+8) as bf16 (zeros outside the matrix). FP8 is widened with its
// block scale; bf16 is copied.
template <WType T>
__device__ __forceinline__ uint4 weight_bf16x8(const WeightView& w, int64_t row, int64_t k) {
  if (row >= w.rows || k >= w.cols) return make_uint4(0, 0, 0, 0);
  if constexpr (T == WType::BF16) {
    return __ldg(
        reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w.data) + row * w.cols + k));
  } else {
    const uint2 raw =
        __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + row * w.cols + k));
    const float sc = w.scale_inv[(row / w.block_rows) * w.scale_cols + k / w.block_cols];
    const uint32_t b[2] = {raw.x, raw.y};
    __nv_bfloat16 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = __float2bfloat16_rn(fp8_to_float(uint8_t(b[i / 4] >> (8 * (i % 4)))) * sc);
    return *reinterpret_cast<const uint4*>(v);
  }
}

// C[64 rows of the item][64 columns from n0] = A[rows][K] · B[n0..n0+63][K]ᵀ for one or two B (gate and up);
// 4 warps of 32×32. kGateUp writes bf16 silu(C_gate) * C_up, else float32 C.
template <WType T, bool kGateUp>
__global__ __launch_bounds__(kMmaThreads) void moe_mma_kernel(ExpertTable t,
                                                              const __nv_bfloat16* __restrict__ A,
                                                              const int32_t* __restrict__ items,
                                                              const int32_t* __restrict__ num_items,
                                                              void* __restrict__ out) {
  constexpr int NB = kGateUp ? 2 : 1;
  __shared__ __align__(32) __nv_bfloat16 As[kMoeMmaTile][kMmaLd];
  __shared__ __align__(32) __nv_bfloat16 Bs[NB][kMmaN][kMmaLd];
  __shared__ __align__(32) float Cs[kMoeMmaTile][kCLd];
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int64_t N = kGateUp ? t.inter : t.hidden, K = kGateUp ? t.hidden : t.inter;
  const int64_t n0 = int64_t(blockIdx.x) * kMmaN;
  WeightView B[NB];
  if constexpr (kGateUp) {
    B[0] = expert_view(t, t.gate, t.gate_scale, e, t.inter, t.hidden);
    B[NB - 1] = expert_view(t, t.up, t.up_scale, e, t.inter, t.hidden);
  } else {
    B[0] = expert_view(t, t.down, t.down_scale, e, t.hidden, t.inter);
  }
  const int warp = threadIdx.x >> 5, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][2][2];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[b][i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += kMmaK) {
    // 64 rows × 4 vectors of 8 columns, for A and each B: 2 per thread.
#pragma unroll
    for (int l = threadIdx.x; l < kMoeMmaTile * 4; l += kMmaThreads) {
      const int r = l / 4, c = (l % 4) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < count && k0 + c < K)
        v = __ldg(reinterpret_cast<const uint4*>(A + int64_t(first + r) * K + k0 + c));
      *reinterpret_cast<uint4*>(&As[r][c]) = v;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        *reinterpret_cast<uint4*>(&Bs[b][r][c]) = weight_bf16x8<T>(B[b], n0 + r, k0 + c);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[wm * 32 + i * 16][kk], kMmaLd);
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, &Bs[b][wn * 32 + j * 16][kk], kMmaLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[b][i][j], fa[i], fb, acc[b][i][j]);
        }
    }
    __syncthreads();
  }

  constexpr int kPer = kMoeMmaTile * kMmaN / kMmaThreads;
  float first_pass[kPer];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[b][i][j], kCLd,
                                wmma::mem_row_major);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int idx = threadIdx.x + q * kMmaThreads, r = idx / kMmaN, c = idx % kMmaN;
      const float v = Cs[r][c];
      if (kGateUp && b == 0) {
        first_pass[q] = siluf_(v);
      } else if (r < count && n0 + c < N) {
        if constexpr (kGateUp)
          static_cast<__nv_bfloat16*>(out)[int64_t(first + r) * N + n0 + c] =
              __float2bfloat16_rn(first_pass[q] * v);
        else
          static_cast<float*>(out)[int64_t(first + r) * N + n0 + c] = v;
      }
    }
    __syncthreads();
  }
}

// out[t] = Σ_j w_j y[row_j], j in ascending expert id.
__global__ void moe_combine_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                                   const int32_t* __restrict__ pair_row, int k, const float* __restrict__ y,
                                   int64_t H, float* __restrict__ out) {
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
    for (int j = 0; j < k; ++j) acc = fmaf(s_w[j], y[int64_t(s_row[j]) * H + c], acc);
    out[t * H + c] = acc;
  }
}

template <WType T>
void run_experts(const ExpertTable& t, const float* x, int64_t n, int top_k, bool tensor_cores, int tile,
                 int64_t max_items, const MoeScratch& s, cudaStream_t stream) {
  const int64_t P = n * top_k;
  if (tensor_cores) {
    if constexpr (T == WType::BF16 || T == WType::FP8) {
      moe_gather_bf16<<<blocks_for(P * t.hidden, 256), 256, 0, stream>>>(
          x, P, t.hidden, top_k, s.sorted, reinterpret_cast<__nv_bfloat16*>(s.xb));
      const dim3 g1(blocks_for(t.inter, kMmaN), unsigned(max_items)),
          g2(blocks_for(t.hidden, kMmaN), unsigned(max_items));
      moe_mma_kernel<T, true><<<g1, kMmaThreads, 0, stream>>>(t, reinterpret_cast<const __nv_bfloat16*>(s.xb),
                                                              s.items, s.num_items, s.h);
      moe_mma_kernel<T, false><<<g2, kMmaThreads, 0, stream>>>(t, static_cast<const __nv_bfloat16*>(s.h),
                                                               s.items, s.num_items, s.y);
    }
    return;
  }
  const bool vec = (t.hidden % W<T>::kVec == 0) && (t.inter % W<T>::kVec == 0) &&
                   (T != WType::FP8 || t.block_cols % W<T>::kVec == 0);
  const int rows_per_block = kSimtWarps * kSimtRows;
  const dim3 g1(blocks_for(t.inter, rows_per_block), unsigned(max_items));
  const dim3 g2(blocks_for(t.hidden, rows_per_block), unsigned(max_items));
  float* h = static_cast<float*>(s.h);
  auto launch = [&](auto vector, auto rows) {
    constexpr bool V = decltype(vector)::value;
    constexpr int Tile = decltype(rows)::value;
    moe_gate_up_simt<T, V, Tile>
        <<<g1, kSimtWarps * 32, 0, stream>>>(t, x, top_k, s.sorted, s.items, s.num_items, h);
    moe_down_simt<T, V, Tile><<<g2, kSimtWarps * 32, 0, stream>>>(t, h, s.items, s.num_items, s.y);
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

}  // namespace

int moe_tile(int64_t n, int top_k, int experts, bool tensor_cores) {
  if (tensor_cores) return kMoeMmaTile;
  // Few pairs per expert (decode): one row per work item, so no warp reduces accumulators it does not use.
  return n * top_k <= 2 * int64_t(experts) / 8 ? 1 : kMoeSimtTile;
}

int64_t moe_max_items(int64_t pairs, int experts, int tile) {
  return std::min<int64_t>(pairs, (pairs + tile - 1) / tile + std::min<int64_t>(experts, pairs));
}

bool moe_mma_supported(const ExpertTable& t) {
  if (t.type != WType::BF16 && t.type != WType::FP8) return false;
  if (t.type == WType::FP8 && t.block_cols % 8 != 0) return false;
  return t.hidden % 8 == 0 && t.inter % 8 == 0;
}

void launch_moe(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize, const float* x,
                int64_t n, bool tensor_cores, const MoeScratch& s, float* out, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t P = n * top_k;
  const int tile = moe_tile(n, top_k, t.experts, tensor_cores);
  if (n <= kFusedRouteMaxTokens) {
    moe_route_plan_kernel<<<1, 1024, 0, stream>>>(router_logits, n, t.experts, top_k, renormalize, tile,
                                                  s.ids, s.weights, s.sorted, s.pair_row, s.items,
                                                  s.num_items);
  } else {
    moe_route_kernel<<<blocks_for(n * 32, 256), 256, 0, stream>>>(router_logits, n, t.experts, top_k,
                                                                  renormalize, s.ids, s.weights);
    moe_plan_kernel<<<1, 1024, 0, stream>>>(s.ids, P, t.experts, tile, s.sorted, s.pair_row, s.items,
                                            s.num_items);
  }
  const int64_t max_items = moe_max_items(P, t.experts, tile);
  MOESERVE_DISPATCH_WTYPE(t.type, T,
                          run_experts<T>(t, x, n, top_k, tensor_cores, tile, max_items, s, stream));
  moe_combine_kernel<<<unsigned(n), 256, 0, stream>>>(s.ids, s.weights, s.pair_row, top_k, s.y, t.hidden,
                                                      out);
}

}  // namespace moeserve::cuda
