// Paged causal attention (GQA) over a cache of float32, bf16 or FP8 E4M3: new K/V rows are rounded into
// their pages, then a flash-style kernel streams key tiles through shared memory with an online softmax. A
// block takes a run of query rows (token × head of one KV group) and one KV head, so each K/V tile it loads
// serves the whole group; calls with few row blocks split the key range over blocks (split-K) and a second
// kernel combines the partial results.
//
// Four kernels. The float32 one (32 rows, SIMT FMAs, stored elements widened to float32 in registers) is the
// exact path. Batched decode with KV groups of up to 16 heads takes attention_decode_kernel, the same
// arithmetic with a warp per query row (below). Prefill in bf16 mode (AttentionArgs::tensor_cores, at least
// one 128-row block, head_dim 64..256) takes attention_tc_kernel: Q, K, V and the probabilities rounded to
// bf16 for mma.sync m16n8k16 with float32 accumulation and a float32 softmax, as FlashAttention-2 does.
// Batched decode in bf16 mode (head_dim 64..256) takes attention_decode_tc_kernel, the same rounding.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kRows = 32;        // query rows per block
constexpr int kMaxSplits = 128;  // key ranges of one row computed apart, then combined
constexpr int kKeys = 32;        // keys per tile
constexpr int kThreads = 256;
constexpr int kPtLd = kRows + 4;

template <int D>
constexpr size_t attention_smem_floats() {
  return size_t(kRows + 2 * kKeys) * (D + 4) + size_t(kKeys) * kPtLd + 3 * kRows;
}

// Four consecutive cache elements of type T: widened to float32 (times the FP8 scale), or rounded from it
// (FP8: value / scale, nearest even, saturated to ±448, as the CPU's f32_to_fp8_e4m3).
template <typename T>
struct KvElems;
template <>
struct KvElems<float> {
  static __device__ __forceinline__ float4 load(const void* base, int64_t i, float) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + i));
  }
  static __device__ __forceinline__ void store(void* base, int64_t i, float4 v, float) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = v;
  }
  static __device__ __forceinline__ void store1(void* base, int64_t i, float v, float) {
    static_cast<float*>(base)[i] = v;
  }
};
template <>
struct KvElems<__nv_bfloat16> {
  static __device__ __forceinline__ float4 load(const void* base, int64_t i, float) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i));
    return make_float4(bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y));
  }
  static __device__ __forceinline__ void store(void* base, int64_t i, float4 v, float) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 w;
    w.x = *reinterpret_cast<const uint32_t*>(&a);
    w.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + i) = w;
  }
  static __device__ __forceinline__ void store1(void* base, int64_t i, float v, float) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  }
};
template <>
struct KvElems<__nv_fp8_e4m3> {
  static __device__ __forceinline__ float4 load(const void* base, int64_t i, float scale) {
    const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + i));
    const float2 a = fp8x2_to_float2(w), b = fp8x2_to_float2(w >> 16);
    return make_float4(a.x * scale, a.y * scale, b.x * scale, b.y * scale);
  }
  static __device__ __forceinline__ uint32_t code(float v, float scale) {
    return __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
  }
  static __device__ __forceinline__ void store(void* base, int64_t i, float4 v, float scale) {
    const uint32_t w =
        code(v.x, scale) | code(v.y, scale) << 8 | code(v.z, scale) << 16 | code(v.w, scale) << 24;
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(base) + i) = w;
  }
  static __device__ __forceinline__ void store1(void* base, int64_t i, float v, float scale) {
    static_cast<uint8_t*>(base)[i] = uint8_t(code(v, scale));
  }
};

template <typename KV>
__global__ void kv_write_kernel(const float* __restrict__ k_new, const float* __restrict__ v_new, int64_t T,
                                int row_elems, const int64_t* __restrict__ start_pos,
                                const int32_t* __restrict__ pages, int page_size, void* k_cache,
                                void* v_cache, float k_scale, float v_scale) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // float4 index
  const int per_row = row_elems / 4;
  if (i >= T * per_row) return;
  const int64_t t = i / per_row, c = i % per_row;
  const int64_t pos = *start_pos + t;
  const int64_t dst = (int64_t(pages[pos / page_size]) * page_size + pos % page_size) * row_elems + c * 4;
  KvElems<KV>::store(k_cache, dst, reinterpret_cast<const float4*>(k_new)[i], k_scale);
  KvElems<KV>::store(v_cache, dst, reinterpret_cast<const float4*>(v_new)[i], v_scale);
}

// Keys kt0 .. kt0 + kKeys - 1 of KV head kvh (zeros past kv_len) into shared rows of D + 4 floats, widened
// from the cache's elements; all threads of the block take part.
template <int D, typename KV>
__device__ __forceinline__ void stage_kv_tile(const AttentionArgs& a, const int32_t* __restrict__ pages,
                                              int kvh, int64_t kt0, int64_t kv_len, float* Ks, float* Vs) {
  constexpr int LD = D + 4, D4 = D / 4;
  const int row_floats = a.kv_heads * D;
  for (int l = threadIdx.x; l < kKeys * D4; l += kThreads) {
    const int j = l / D4, c4 = l % D4;
    const int64_t kp = kt0 + j;
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
    if (kp < kv_len) {
      const int64_t off = (int64_t(pages[kp / a.page_size]) * a.page_size + kp % a.page_size) * row_floats +
                          int64_t(kvh) * D + c4 * 4;
      kv = KvElems<KV>::load(a.k_cache, off, a.k_scale);
      vv = KvElems<KV>::load(a.v_cache, off, a.v_scale);
    }
    *reinterpret_cast<float4*>(Ks + j * LD + c4 * 4) = kv;
    *reinterpret_cast<float4*>(Vs + j * LD + c4 * 4) = vv;
  }
}

// The D / 32 output columns a lane owns in the value phase: float4 runs, lane-interleaved, when D ≥ 128.
template <int D>
__device__ __forceinline__ int lane_column(int c, int lane) {
  constexpr int kCols = D / 32;
  return kCols >= 4 ? ((c / 4) * 32 + lane) * 4 + c % 4 : c * 32 + lane;
}
// Those columns of one shared V row.
template <int D>
__device__ __forceinline__ void load_v_columns(const float* vrow, int lane, float (&v)[D / 32]) {
  constexpr int kCols = D / 32;
  if constexpr (kCols >= 4) {
#pragma unroll
    for (int q = 0; q < kCols / 4; ++q) {
      const float4 v4 = *reinterpret_cast<const float4*>(vrow + (q * 32 + lane) * 4);
      v[4 * q] = v4.x, v[4 * q + 1] = v4.y, v[4 * q + 2] = v4.z, v[4 * q + 3] = v4.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < kCols; ++q) v[q] = vrow[q * 32 + lane];
  }
}

template <int D, typename KV>
__global__ __launch_bounds__(kThreads) void attention_kernel(AttentionArgs a) {
  pdl_begin();
  extern __shared__ float4 smem4[];
  constexpr int LD = D + 4;
  constexpr int D4 = D / 4;
  float* smem = reinterpret_cast<float*>(smem4);
  float* Qs = smem;
  float* Ks = Qs + kRows * LD;
  float* Vs = Ks + kKeys * LD;
  float* Pt = Vs + kKeys * LD;  // probabilities, transposed: [key][row]
  float* alpha_s = Pt + kKeys * kPtLd;
  float* m_s = alpha_s + kRows;
  float* l_s = m_s + kRows;

  const int G = a.heads / a.kv_heads;
  const int kvh = blockIdx.y;
  // Batched decode: blockIdx.x covers (sequence, row block); seq offsets the token index of q and out.
  int64_t seq = 0, bx = blockIdx.x, T = a.T, start;
  const int32_t* pages = a.pages;
  if (a.batch) {
    const int64_t per_seq = (G + kRows - 1) / kRows;
    seq = bx / per_seq, bx = bx % per_seq, T = 1;
    start = a.start_pos[seq];
    pages += seq * a.pages_stride;
  } else {
    start = *a.start_pos;
  }
  const int64_t rows_total = T * G;
  const int64_t rho0 = bx * kRows;
  const float scale = 1.0f / sqrtf(float(D));

  for (int l = threadIdx.x; l < kRows * D4; l += kThreads) {
    const int r = l / D4, c4 = l % D4;
    const int64_t rho = rho0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (rho < rows_total) {
      const int64_t t = rho / G;
      const int h = kvh * G + int(rho % G);
      v = reinterpret_cast<const float4*>(a.q + ((seq + t) * a.heads + h) * D)[c4];
    }
    *reinterpret_cast<float4*>(Qs + r * LD + c4 * 4) = v;
  }

  // Keys this block needs: up to the last query's position; this split takes a contiguous run of tiles.
  const int64_t t_last = (imin(rho0 + kRows, rows_total) - 1) / G;
  const int64_t kv_len = start + t_last + 1;
  const int64_t tiles = (kv_len + kKeys - 1) / kKeys;
  const int64_t per_split = (tiles + a.splits - 1) / a.splits;
  const int64_t tile_begin = int64_t(blockIdx.z) * per_split, tile_end = imin(tiles, tile_begin + per_split);

  // Score phase: thread owns rows {sr, sr+16} × keys {sk, sk+16} of the tile.
  const int sr = threadIdx.x / 16, sk = threadIdx.x % 16;
  int64_t qpos[2];
  bool rvalid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t rho = rho0 + sr + 16 * i;
    rvalid[i] = rho < rows_total;
    qpos[i] = start + rho / G;
  }
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // Value phase: warp pr owns rows 4pr..4pr+3, lane pc owns D/32 columns.
  const int pr = threadIdx.x / 32, pc = threadIdx.x % 32;
  constexpr int kCols = D / 32;
  float acc[4][kCols] = {};

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t kt0 = tile * kKeys;
    __syncthreads();  // the previous tile is consumed (and Qs is written, on the first pass)
    stage_kv_tile<D, KV>(a, pages, kvh, kt0, kv_len, Ks, Vs);
    __syncthreads();

    float s[2][2] = {};
#pragma unroll 4
    for (int d4 = 0; d4 < D4; ++d4) {
      float4 q[2], k[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        q[i] = *reinterpret_cast<const float4*>(Qs + (sr + 16 * i) * LD + d4 * 4);
        k[i] = *reinterpret_cast<const float4*>(Ks + (sk + 16 * i) * LD + d4 * 4);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          s[i][jj] = fmaf(q[i].x, k[jj].x, s[i][jj]);
          s[i][jj] = fmaf(q[i].y, k[jj].y, s[i][jj]);
          s[i][jj] = fmaf(q[i].z, k[jj].z, s[i][jj]);
          s[i][jj] = fmaf(q[i].w, k[jj].w, s[i][jj]);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int64_t kp = kt0 + sk + 16 * jj;
        s[i][jj] = (rvalid[i] && kp <= qpos[i]) ? s[i][jj] * scale : -INFINITY;
      }
      float mx = fmaxf(s[i][0], s[i][1]);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_run[i], mx);
      float p0 = 0.f, p1 = 0.f, alpha = 1.f;
      if (m_new != -INFINITY) {
        p0 = expf(s[i][0] - m_new);
        p1 = expf(s[i][1] - m_new);
        alpha = expf(m_run[i] - m_new);
      }
      float psum = p0 + p1;
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l_run[i] = l_run[i] * alpha + psum;
      m_run[i] = m_new;
      const int r = sr + 16 * i;
      Pt[sk * kPtLd + r] = p0;
      Pt[(sk + 16) * kPtLd + r] = p1;
      if (sk == 0) alpha_s[r] = alpha;
    }
    __syncthreads();

#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
      const float al = alpha_s[pr * 4 + r4];
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r4][c] *= al;
    }
#pragma unroll 4
    for (int j = 0; j < kKeys; ++j) {
      const float4 p4 = *reinterpret_cast<const float4*>(Pt + j * kPtLd + pr * 4);
      const float p[4] = {p4.x, p4.y, p4.z, p4.w};
      float v[kCols];
      load_v_columns<D>(Vs + j * LD, pc, v);
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r4][c] = fmaf(p[r4], v[c], acc[r4][c]);
    }
  }

  if (sk == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) m_s[sr + 16 * i] = m_run[i], l_s[sr + 16 * i] = l_run[i];
  }
  __syncthreads();
  const int64_t out_rows = a.T * a.heads;
#pragma unroll
  for (int r4 = 0; r4 < 4; ++r4) {
    const int r = pr * 4 + r4;
    const int64_t rho = rho0 + r;
    if (rho >= rows_total) continue;
    const int64_t row = (seq + rho / G) * a.heads + kvh * G + rho % G;
    auto column = [&](int c) { return lane_column<D>(c, pc); };
    if (a.splits == 1) {
      const float inv = 1.0f / l_s[r];
#pragma unroll
      for (int c = 0; c < kCols; ++c) a.out[row * D + column(c)] = acc[r4][c] * inv;
    } else {
      const int64_t prow = int64_t(blockIdx.z) * out_rows + row;
#pragma unroll
      for (int c = 0; c < kCols; ++c) a.part_out[prow * D + column(c)] = acc[r4][c];
      if (pc == 0) a.part_m[prow] = m_s[r], a.part_l[prow] = l_s[r];
    }
  }
}

// ---- batched decode ----------------------------------------------------------------------------------
// One query row per head of the KV group (G ≤ 16): a block takes one (sequence, KV head, split) with a warp
// per query row (two rows per warp when G > 8). Lane j scores key j of the tile, the warp's shuffles make the
// row's online softmax, and the value phase takes lane j's probability by shuffle. The general kernel's
// 32-row blocks left 24 of their 32 rows idle at G = 8 and ran four times the arithmetic: at an 8K-token
// context a batch-16 decode step spent ~1 ms in each attention layer.
constexpr int kDecodeWarps = kThreads / 32;
constexpr int kDecodeMaxGroup = 16;

template <int D, int R>
constexpr size_t decode_smem_floats() {
  return size_t(R + 2 * kKeys) * (D + 4);
}

template <int D, typename KV, int R>  // R: query rows per block, kDecodeWarps or 2 x kDecodeWarps
__global__ __launch_bounds__(kThreads) void attention_decode_kernel(AttentionArgs a) {
  pdl_begin();
  extern __shared__ float4 smem4[];
  constexpr int LD = D + 4;
  constexpr int D4 = D / 4;
  constexpr int RW = R / kDecodeWarps;  // rows per warp
  constexpr int kCols = D / 32;         // output columns per lane
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + R * LD;
  float* Vs = Ks + kKeys * LD;

  const int G = a.heads / a.kv_heads;
  const int kvh = blockIdx.y;
  const int64_t seq = blockIdx.x;
  const int64_t start = a.start_pos[seq];
  const int32_t* pages = a.pages + seq * a.pages_stride;
  const float scale = 1.0f / sqrtf(float(D));

  for (int l = threadIdx.x; l < R * D4; l += kThreads) {
    const int r = l / D4, c4 = l % D4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < G) v = reinterpret_cast<const float4*>(a.q + (seq * a.heads + kvh * G + r) * D)[c4];
    *reinterpret_cast<float4*>(Qs + r * LD + c4 * 4) = v;
  }

  // The row attends to positions 0..start; this split takes a contiguous run of key tiles.
  const int64_t kv_len = start + 1;
  const int64_t tiles = (kv_len + kKeys - 1) / kKeys;
  const int64_t per_split = (tiles + a.splits - 1) / a.splits;
  const int64_t tile_begin = int64_t(blockIdx.z) * per_split, tile_end = imin(tiles, tile_begin + per_split);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto column = [&](int c) { return lane_column<D>(c, lane); };
  float m_run[RW], l_run[RW], acc[RW][kCols];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    m_run[i] = -INFINITY, l_run[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.f;
  }

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t kt0 = tile * kKeys;
    __syncthreads();  // the previous tile is consumed (and Qs is written, on the first pass)
    stage_kv_tile<D, KV>(a, pages, kvh, kt0, kv_len, Ks, Vs);
    __syncthreads();

    // Scores and softmax: lane = key of the tile, one row per warp at a time (warp-uniform branches).
    float p[RW];
    const bool key_valid = kt0 + lane < kv_len;
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      p[i] = 0.f;
      const int r = warp + kDecodeWarps * i;
      if (r >= G) continue;
      float s = 0.f;
#pragma unroll 8
      for (int d4 = 0; d4 < D4; ++d4) {
        const float4 q = *reinterpret_cast<const float4*>(Qs + r * LD + d4 * 4);
        const float4 k = *reinterpret_cast<const float4*>(Ks + lane * LD + d4 * 4);
        s = fmaf(q.x, k.x, s);
        s = fmaf(q.y, k.y, s);
        s = fmaf(q.z, k.z, s);
        s = fmaf(q.w, k.w, s);
      }
      s = key_valid ? s * scale : -INFINITY;
      float mx = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_run[i], mx);  // finite: the tile's first key is in range
      p[i] = expf(s - m_new);
      const float alpha = expf(m_run[i] - m_new);
      float psum = p[i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l_run[i] = l_run[i] * alpha + psum;
      m_run[i] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= alpha;
    }

    // Values: lane owns kCols columns; each key's V row is read once for the warp's rows.
#pragma unroll 4
    for (int j = 0; j < kKeys; ++j) {
      float v[kCols];
      load_v_columns<D>(Vs + j * LD, lane, v);
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const float pj = __shfl_sync(0xffffffffu, p[i], j);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[i][c] = fmaf(pj, v[c], acc[i][c]);
      }
    }
  }

  const int64_t out_rows = a.T * a.heads;
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = warp + kDecodeWarps * i;
    if (r >= G) continue;
    const int64_t row = seq * a.heads + kvh * G + r;
    if (a.splits == 1) {
      const float inv = 1.0f / l_run[i];
#pragma unroll
      for (int c = 0; c < kCols; ++c) a.out[row * D + column(c)] = acc[i][c] * inv;
    } else {
      // A split past the row's keys has no tiles: m = -inf and l = 0, which the combine skips.
      const int64_t prow = int64_t(blockIdx.z) * out_rows + row;
#pragma unroll
      for (int c = 0; c < kCols; ++c) a.part_out[prow * D + column(c)] = acc[i][c];
      if (lane == 0) a.part_m[prow] = m_run[i], a.part_l[prow] = l_run[i];
    }
  }
}

// ---- prefill on tensor cores -----------------------------------------------------------------------------
constexpr int kTcRows = 128;  // query rows per block: 16 per warp
constexpr int kTcKeys = 64;   // keys per tile
constexpr int kTcThreads = 256;

// bf16 per shared row: 16 bytes of skew, so the 8 row addresses of an ldmatrix fall in 8 bank groups.
template <int D>
constexpr int tc_pitch() {
  return D + 8;
}
// Q, then two stages of K and V tiles.
template <int D>
constexpr size_t tc_smem_bytes() {
  return size_t(kTcRows + 4 * kTcKeys) * tc_pitch<D>() * sizeof(__nv_bfloat16);
}

// Eight consecutive cache elements of type T as eight bf16 (a 16-byte shared store). bf16 pages skip this:
// they are copied as they are with cp.async.
template <typename T>
struct KvBf16x8;
template <>
struct KvBf16x8<float> {
  static __device__ __forceinline__ uint4 load(const void* base, int64_t i, float) {
    const auto* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    return make_uint4(bf16x2_bits(a.x, a.y), bf16x2_bits(a.z, a.w), bf16x2_bits(b.x, b.y),
                      bf16x2_bits(b.z, b.w));
  }
};
template <>
struct KvBf16x8<__nv_fp8_e4m3> {
  static __device__ __forceinline__ uint4 load(const void* base, int64_t i, float scale) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + i));
    uint32_t out[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float2 f = fp8x2_to_float2((h < 2 ? w.x : w.y) >> (16 * (h & 1)));
      out[h] = bf16x2_bits(f.x * scale, f.y * scale);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }
};

// Key tile `tile` (of Keys keys, by a block of Threads threads) into one stage (Ks, then Vs): bf16 pages by
// cp.async (in flight until the caller waits for the group), other dtypes widened through registers. Keys
// past kv_len are zeros: a stale page's bits could be NaN, and 0 · NaN would reach O.
template <int D, typename KV, int Keys, int Threads>
__device__ __forceinline__ void load_kv_tile(const AttentionArgs& a, const int32_t* __restrict__ pages,
                                             int kvh, int64_t tile, int64_t kv_len, __nv_bfloat16* Ks,
                                             __nv_bfloat16* Vs) {
  constexpr int P = tc_pitch<D>();
  constexpr int C8 = D / 8;  // 16-byte chunks per bf16 row
  const int64_t row_elems = int64_t(a.kv_heads) * D;
  for (int l = threadIdx.x; l < Keys * C8; l += Threads) {
    const int j = l / C8, c = l % C8;
    const int64_t kp = tile * Keys + j;
    const bool live = kp < kv_len;
    const int64_t off =
        live ? (int64_t(pages[kp / a.page_size]) * a.page_size + kp % a.page_size) * row_elems +
                   int64_t(kvh) * D + c * 8
             : 0;
    if constexpr (std::is_same_v<KV, __nv_bfloat16>) {
      cp_async16(Ks + j * P + c * 8, static_cast<const __nv_bfloat16*>(a.k_cache) + off, live);
      cp_async16(Vs + j * P + c * 8, static_cast<const __nv_bfloat16*>(a.v_cache) + off, live);
    } else {
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (live) {
        kv = KvBf16x8<KV>::load(a.k_cache, off, a.k_scale);
        vv = KvBf16x8<KV>::load(a.v_cache, off, a.v_scale);
      }
      *reinterpret_cast<uint4*>(Ks + j * P + c * 8) = kv;
      *reinterpret_cast<uint4*>(Vs + j * P + c * 8) = vv;
    }
  }
}

// The tile steps both tensor-core kernels share, for one warp's m16 tile of query rows. Thread (g, q) =
// (lane / 4, lane % 4) holds rows g and g + 8: S element e of n8 tile j is key 8j + 2q + (e % 2) of row
// g + 8(e / 2); O element e of n8 tile j is dimension 8j + 2q + (e % 2) of the same rows.

// S = Q Kᵀ for Keys keys: Qr points at the warp's 16 query rows, Ks at the tile's keys (bf16, pitch P).
template <int D, int Keys>
__device__ __forceinline__ void tc_scores(const __nv_bfloat16* Qr, const __nv_bfloat16* Ks,
                                          float (&s)[Keys / 8][4]) {
  constexpr int P = tc_pitch<D>();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t qa[4];
    ldmatrix_x4(qa, Qr + (lane & 15) * P + kk + (lane >> 4) * 8);
#pragma unroll
    for (int jp = 0; jp < Keys / 16; ++jp) {
      uint32_t b[4];  // n8 tiles 2jp and 2jp+1, k halves 0 and 1 each
      ldmatrix_x4(b, Ks + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * P + kk + ((lane >> 3) & 1) * 8);
      mma_bf16(s[2 * jp], qa[0], qa[1], qa[2], qa[3], b[0], b[1]);
      mma_bf16(s[2 * jp + 1], qa[0], qa[1], qa[2], qa[3], b[2], b[3]);
    }
  }
}

// The online softmax over one tile of masked, scaled scores (-inf where masked), in the accumulators'
// registers: a row's four owner threads reduce by shuffles. s becomes the probabilities, O (NO n8 tiles) is
// rescaled, m_run / l_run move on.
template <int NJ, int NO>
__device__ __forceinline__ void tc_online_softmax(float (&s)[NJ][4], float (&m_run)[2], float (&l_run)[2],
                                                  float (&o)[NO][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
  float alpha[2], m_use[2], psum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float m_new = fmaxf(m_run[i], mx[i]);
    // A row with no visible key yet keeps m = -inf: its probabilities are 0 and nothing is rescaled.
    m_use[i] = m_new == -INFINITY ? 0.f : m_new;
    alpha[i] = __expf(m_run[i] - m_use[i]);
    m_run[i] = m_new;
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = __expf(s[j][e] - m_use[e / 2]);
      psum[e / 2] += s[j][e];
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    psum[i] += __shfl_xor_sync(0xffffffffu, psum[i], 1);
    psum[i] += __shfl_xor_sync(0xffffffffu, psum[i], 2);
    l_run[i] = l_run[i] * alpha[i] + psum[i];
  }
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    o[j][0] *= alpha[0], o[j][1] *= alpha[0];
    o[j][2] *= alpha[1], o[j][3] *= alpha[1];
  }
}

// O += P V over Keys keys for Cols columns of V from Vc (the tile's first key at those columns): P's
// accumulator layout is the A fragment.
template <int D, int Keys, int Cols>
__device__ __forceinline__ void tc_apply_values(const float (&s)[Keys / 8][4], const __nv_bfloat16* Vc,
                                                float (&o)[Cols / 8][4]) {
  constexpr int P = tc_pitch<D>();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kj = 0; kj < Keys / 16; ++kj) {
    const uint32_t pa[4] = {bf16x2_bits(s[2 * kj][0], s[2 * kj][1]), bf16x2_bits(s[2 * kj][2], s[2 * kj][3]),
                            bf16x2_bits(s[2 * kj + 1][0], s[2 * kj + 1][1]),
                            bf16x2_bits(s[2 * kj + 1][2], s[2 * kj + 1][3])};
#pragma unroll
    for (int np = 0; np < Cols / 16; ++np) {
      uint32_t b[4];  // keys 16kj..+15 of columns 16np..+7 and 16np+8..+15
      ldmatrix_x4_trans(b,
                        Vc + (kj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + np * 16 + (lane >> 4) * 8);
      mma_bf16(o[2 * np], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
      mma_bf16(o[2 * np + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
    }
  }
}

// Warp w owns query rows 16w..16w+15 of the block. Per key tile (the tile steps above): S = Q Kᵀ (16 x 64,
// float32 accumulators), masked (causal) and scaled, the online softmax, then O += P V. The next tile's K and
// V load into the other stage while this one is multiplied.
template <int D, typename KV>
__global__ __launch_bounds__(kTcThreads) void attention_tc_kernel(AttentionArgs a) {
  pdl_begin();
  constexpr int P = tc_pitch<D>();
  constexpr int C8 = D / 8;  // 16-byte chunks per bf16 row
  extern __shared__ uint4 smem_tc[];
  auto* Qs = reinterpret_cast<__nv_bfloat16*>(smem_tc);
  auto* stages = Qs + kTcRows * P;  // stage s: K tile at stages + 2s·kTcKeys·P, its V tile after it
  auto stage_k = [&](int64_t tile) { return stages + int(tile & 1) * 2 * kTcKeys * P; };

  const int G = a.heads / a.kv_heads;
  const int kvh = blockIdx.y;
  const int64_t start = *a.start_pos;
  const int64_t rows_total = a.T * G;
  // Causal: the last rows see the most keys. Blocks start in index order, so the longest go first and the
  // short ones fill the tail of the grid.
  const int64_t rho0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTcRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q4 = lane % 4;

  // Keys this block needs: up to the last query's position; this split takes a contiguous run of tiles.
  const int64_t t_last = (imin(rho0 + kTcRows, rows_total) - 1) / G;
  const int64_t kv_len = start + t_last + 1;
  const int64_t tiles = (kv_len + kTcKeys - 1) / kTcKeys;
  const int64_t per_split = (tiles + a.splits - 1) / a.splits;
  const int64_t tile_begin = int64_t(blockIdx.z) * per_split, tile_end = imin(tiles, tile_begin + per_split);
  if (tile_begin < tile_end)
    load_kv_tile<D, KV, kTcKeys, kTcThreads>(a, a.pages, kvh, tile_begin, kv_len, stage_k(tile_begin),
                                             stage_k(tile_begin) + kTcKeys * P);
  cp_async_commit();

  for (int l = threadIdx.x; l < kTcRows * C8; l += kTcThreads) {
    const int r = l / C8, c = l % C8;
    const int64_t rho = rho0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (rho < rows_total) {
      const int64_t t = rho / G;
      const int h = kvh * G + int(rho % G);
      const auto* src = reinterpret_cast<const float4*>(a.q + (t * a.heads + h) * D + c * 8);
      const float4 x0 = src[0], x1 = src[1];
      v = make_uint4(bf16x2_bits(x0.x, x0.y), bf16x2_bits(x0.z, x0.w), bf16x2_bits(x1.x, x1.y),
                     bf16x2_bits(x1.z, x1.w));
    }
    *reinterpret_cast<uint4*>(Qs + r * P + c * 8) = v;
  }

  int64_t qpos[2];
  bool rvalid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t rho = rho0 + warp * 16 + g + 8 * i;
    rvalid[i] = rho < rows_total;
    qpos[i] = start + rho / G;
  }
  const float scale = 1.0f / sqrtf(float(D));
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[D / 8][4] = {};

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t kt0 = tile * kTcKeys;
    if (tile + 1 < tile_end)
      load_kv_tile<D, KV, kTcKeys, kTcThreads>(a, a.pages, kvh, tile + 1, kv_len, stage_k(tile + 1),
                                               stage_k(tile + 1) + kTcKeys * P);
    cp_async_commit();  // one group per iteration (empty at the last), so "all but one" is this tile's
    cp_async_wait<1>();
    __syncthreads();  // this tile's stage (and Qs, on the first pass) is written by every thread
    const __nv_bfloat16* Ks = stage_k(tile);
    const __nv_bfloat16* Vs = Ks + kTcKeys * P;

    float s[kTcKeys / 8][4] = {};
    tc_scores<D, kTcKeys>(Qs + warp * 16 * P, Ks, s);
#pragma unroll
    for (int j = 0; j < kTcKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const int64_t kp = kt0 + 8 * j + 2 * q4 + (e & 1);
        s[j][e] = rvalid[i] && kp <= qpos[i] ? s[j][e] * scale : -INFINITY;
      }
    tc_online_softmax(s, m_run, l_run, o);
    tc_apply_values<D, kTcKeys, D>(s, Vs, o);
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }

  const int64_t out_rows = a.T * a.heads;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t rho = rho0 + warp * 16 + g + 8 * i;
    if (rho >= rows_total) continue;
    const int64_t row = (rho / G) * a.heads + kvh * G + rho % G;
    if (a.splits == 1) {
      const float inv = 1.0f / l_run[i];
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<float2*>(a.out + row * D + 8 * j + 2 * q4) =
            make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    } else {
      const int64_t prow = int64_t(blockIdx.z) * out_rows + row;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<float2*>(a.part_out + prow * D + 8 * j + 2 * q4) =
            make_float2(o[j][2 * i], o[j][2 * i + 1]);
      if (q4 == 0) a.part_m[prow] = m_run[i], a.part_l[prow] = l_run[i];
    }
  }
}

// ---- batched decode on tensor cores ---------------------------------------------------------------------
// bf16 mode, KV groups of at most 16 heads: block = (sequence, KV head, split), the group's query rows padded
// to one m16 tile. Every warp computes the whole key tile's scores S = Q Kᵀ (16 x 32) and their online
// softmax (the same values in every warp, so nothing is exchanged), then multiplies P by its own quarter of
// V's columns; the next tile's K and V load into the other stage meanwhile. The float32 decode kernel has
// each warp read the whole K and V tile from shared memory for its single row, eight times the tile per KV
// head: shared-memory bound (a batch-16 step at an 8K context spent 390 µs a layer there, against ~60 µs of
// HBM traffic). The tile steps are attention_tc_kernel's (above).
constexpr int kDecTcKeys = 32;
constexpr int kDecTcWarps = 4;
constexpr int kDecTcThreads = 32 * kDecTcWarps;

template <int D>
constexpr size_t decode_tc_smem_bytes() {
  return size_t(16 + 4 * kDecTcKeys) * tc_pitch<D>() * sizeof(__nv_bfloat16);
}

template <int D, typename KV>
__global__ __launch_bounds__(kDecTcThreads) void attention_decode_tc_kernel(AttentionArgs a) {
  pdl_begin();
  constexpr int P = tc_pitch<D>();
  constexpr int C8 = D / 8;
  constexpr int DW = D / kDecTcWarps;  // output columns per warp
  extern __shared__ uint4 smem_dtc[];
  auto* Qs = reinterpret_cast<__nv_bfloat16*>(smem_dtc);
  auto* stages = Qs + 16 * P;
  auto stage_k = [&](int64_t tile) { return stages + int(tile & 1) * 2 * kDecTcKeys * P; };

  const int G = a.heads / a.kv_heads;
  const int kvh = blockIdx.y;
  const int64_t seq = blockIdx.x;
  const int32_t* pages = a.pages + seq * a.pages_stride;
  const int64_t kv_len = a.start_pos[seq] + 1;
  const int64_t tiles = (kv_len + kDecTcKeys - 1) / kDecTcKeys;
  const int64_t per_split = (tiles + a.splits - 1) / a.splits;
  const int64_t tile_begin = int64_t(blockIdx.z) * per_split, tile_end = imin(tiles, tile_begin + per_split);
  auto load = [&](int64_t tile) {
    load_kv_tile<D, KV, kDecTcKeys, kDecTcThreads>(a, pages, kvh, tile, kv_len, stage_k(tile),
                                                   stage_k(tile) + kDecTcKeys * P);
  };
  if (tile_begin < tile_end) load(tile_begin);
  cp_async_commit();

  for (int l = threadIdx.x; l < 16 * C8; l += kDecTcThreads) {
    const int r = l / C8, c = l % C8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < G) {
      const auto* src = reinterpret_cast<const float4*>(a.q + (seq * a.heads + kvh * G + r) * D + c * 8);
      const float4 x0 = src[0], x1 = src[1];
      v = make_uint4(bf16x2_bits(x0.x, x0.y), bf16x2_bits(x0.z, x0.w), bf16x2_bits(x1.x, x1.y),
                     bf16x2_bits(x1.z, x1.w));
    }
    *reinterpret_cast<uint4*>(Qs + r * P + c * 8) = v;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q4 = lane % 4;
  const float scale = 1.0f / sqrtf(float(D));
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[DW / 8][4] = {};

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t kt0 = tile * kDecTcKeys;
    if (tile + 1 < tile_end) load(tile + 1);
    cp_async_commit();  // one group per iteration (empty at the last), so "all but one" is this tile's
    cp_async_wait<1>();
    __syncthreads();  // this tile's stage (and Qs, on the first pass) is written by every thread
    const __nv_bfloat16* Ks = stage_k(tile);
    const __nv_bfloat16* Vs = Ks + kDecTcKeys * P;

    float s[kDecTcKeys / 8][4] = {};
    tc_scores<D, kDecTcKeys>(Qs, Ks, s);
    // Every row sees keys 0..kv_len-1; a split's tiles start inside that range, so each tile has a live key.
#pragma unroll
    for (int j = 0; j < kDecTcKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kp = kt0 + 8 * j + 2 * q4 + (e & 1);
        s[j][e] = kp < kv_len ? s[j][e] * scale : -INFINITY;
      }
    tc_online_softmax(s, m_run, l_run, o);
    tc_apply_values<D, kDecTcKeys, DW>(s, Vs + warp * DW, o);
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }

  const int64_t out_rows = a.T * a.heads;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = g + 8 * i;
    if (r >= G) continue;
    const int64_t row = seq * a.heads + kvh * G + r;
    const int col0 = warp * DW + 2 * q4;
    if (a.splits == 1) {
      const float inv = 1.0f / l_run[i];
#pragma unroll
      for (int j = 0; j < DW / 8; ++j)
        *reinterpret_cast<float2*>(a.out + row * D + col0 + 8 * j) =
            make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    } else {
      // A split past the row's keys has no tiles: m = -inf and l = 0, which the combine skips.
      const int64_t prow = int64_t(blockIdx.z) * out_rows + row;
#pragma unroll
      for (int j = 0; j < DW / 8; ++j)
        *reinterpret_cast<float2*>(a.part_out + prow * D + col0 + 8 * j) =
            make_float2(o[j][2 * i], o[j][2 * i + 1]);
      if (warp == 0 && q4 == 0) a.part_m[prow] = m_run[i], a.part_l[prow] = l_run[i];
    }
  }
}

// One block per output row (kCombineThreads ≥ splits): thread s turns split s's maximum and sum into its
// weight e^(m_s − M) / Σ_s e^(m_s − M) l_s in shared memory, then each thread sums its columns over the
// splits with independent loads. (Every thread used to walk all splits' maxima three times over, serially: at
// the 128 splits of a batch-1 decode at an 8K context that was most of the combine.)
constexpr int kCombineThreads = 128;
static_assert(kCombineThreads >= kMaxSplits, "a combine thread per split");
__global__ __launch_bounds__(kCombineThreads) void attention_combine_kernel(AttentionArgs a) {
  pdl_begin();
  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[32];
  const int64_t rows = a.T * a.heads, row = blockIdx.x;
  const int s = threadIdx.x;
  const float m = s < a.splits ? a.part_m[s * rows + row] : -INFINITY;
  const float M = block_max(m, scratch);  // finite: the first split has keys
  const float e = m != -INFINITY ? expf(m - M) : 0.f;
  const float total = block_sum(s < a.splits ? e * a.part_l[s * rows + row] : 0.f, scratch);
  if (s < a.splits) weight[s] = e / total;
  __syncthreads();
  for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) {
    float o = 0.f;
#pragma unroll 4
    for (int t = 0; t < a.splits; ++t) {
      const float w = weight[t];
      if (w != 0.f) o = fmaf(w, a.part_out[(t * rows + row) * a.head_dim + c], o);  // empty splits skipped
    }
    a.out[row * a.head_dim + c] = o;
  }
}

// Batched decode prologue: block = (head row, sequence) over the H query heads then the KV heads of each
// sequence: zero-centred RMSNorm, RoPE at the sequence's rope position (its cache position plus its M-RoPE
// offset); K rows (and their V rows) go into the cache at the cache position.
constexpr int kMaxHeadDim = 256;
template <typename KV>
__global__ void attention_decode_prep_kernel(
    const float* __restrict__ qg, float* __restrict__ q, float* k, const float* __restrict__ v, int heads,
    int kv_heads, int D, const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    int half, const float* __restrict__ inv_freq, const int64_t* __restrict__ positions,
    const int64_t* __restrict__ rope_positions, const int32_t* __restrict__ pages, int64_t pages_stride,
    int page_size, void* k_cache, void* v_cache, float k_scale, float v_scale) {
  pdl_begin();
  __shared__ float scratch[32], row[kMaxHeadDim];
  const int hh = blockIdx.x;
  const int64_t seq = blockIdx.y;
  const bool is_q = hh < heads;
  const int kh = hh - heads;
  const float* src = is_q ? qg + (seq * heads + hh) * 2 * D : k + (seq * kv_heads + kh) * D;
  float* dst = is_q ? q + (seq * heads + hh) * D : k + (seq * kv_heads + kh) * D;
  const float* w = is_q ? q_norm : k_norm;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += src[i] * src[i];
  const float scale = 1.0f / sqrtf(block_sum(ss, scratch) / float(D) + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = src[i] * scale * (1.0f + w[i]);
  __syncthreads();
  const int64_t pos = positions[seq], rope_pos = rope_positions[seq];
  const int64_t at =
      is_q
          ? 0
          : ((int64_t(pages[seq * pages_stride + pos / page_size]) * page_size + pos % page_size) * kv_heads +
             kh) *
                D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float o = row[i];
    if (i < 2 * half) {
      const int j = i < half ? i : i - half;
      const float angle = float(rope_pos) * inv_freq[j];
      const float c = cosf(angle), sn = sinf(angle);
      const float a0 = row[j], b0 = row[j + half];
      o = i < half ? a0 * c - b0 * sn : b0 * c + a0 * sn;
    }
    dst[i] = o;
    if (!is_q) {
      KvElems<KV>::store1(k_cache, at + i, o, k_scale);
      KvElems<KV>::store1(v_cache, at + i, v[(seq * kv_heads + kh) * D + i], v_scale);
    }
  }
}

template <int D, typename KV>
void launch_for(const AttentionArgs& a, cudaStream_t s) {
  constexpr size_t bytes = attention_smem_floats<D>() * sizeof(float);
  static bool configured = false;  // the attribute is per kernel and process
  if (!configured) {
    cudaFuncSetAttribute(attention_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    configured = true;
  }
  const int G = a.heads / a.kv_heads;
  const unsigned row_blocks = a.batch ? unsigned(a.T) * blocks_for(G, kRows) : blocks_for(a.T * G, kRows);
  const dim3 grid(row_blocks, unsigned(a.kv_heads), unsigned(a.splits));
  launch_k(attention_kernel<D, KV>, grid, kThreads, bytes, s, a);
}

template <int D, typename KV, int R>
void launch_decode_rows(const AttentionArgs& a, cudaStream_t s) {
  constexpr size_t bytes = decode_smem_floats<D, R>() * sizeof(float);
  static bool configured = false;  // the attribute is per kernel and process
  if (!configured) {
    cudaFuncSetAttribute(attention_decode_kernel<D, KV, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(bytes));
    configured = true;
  }
  const dim3 grid(unsigned(a.T), unsigned(a.kv_heads), unsigned(a.splits));
  launch_k(attention_decode_kernel<D, KV, R>, grid, kThreads, bytes, s, a);
}

template <int D, typename KV>
void launch_decode_for(const AttentionArgs& a, cudaStream_t s) {
  if (a.heads / a.kv_heads <= kDecodeWarps)
    launch_decode_rows<D, KV, kDecodeWarps>(a, s);
  else
    launch_decode_rows<D, KV, 2 * kDecodeWarps>(a, s);
}

// The decode kernel: batched decode (one token per sequence) with a KV group of at most 16 heads.
bool takes_decode_kernel(const AttentionArgs& a) {
  return a.batch && a.heads / a.kv_heads <= kDecodeMaxGroup;
}

// Its tensor-core form: bf16 mode, head_dim 64..256.
bool takes_decode_tensor_cores(const AttentionArgs& a) {
  return a.tensor_cores && takes_decode_kernel(a) && a.head_dim >= 64;
}

template <int D, typename KV>
void launch_decode_tc_for(const AttentionArgs& a, cudaStream_t s) {
  constexpr size_t bytes = decode_tc_smem_bytes<D>();
  static bool configured = false;  // the attribute is per kernel and process
  if (!configured) {
    cudaFuncSetAttribute(attention_decode_tc_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(bytes));
    configured = true;
  }
  const dim3 grid(unsigned(a.T), unsigned(a.kv_heads), unsigned(a.splits));
  launch_k(attention_decode_tc_kernel<D, KV>, grid, kDecTcThreads, bytes, s, a);
}

template <int D, typename KV>
void launch_tc_for(const AttentionArgs& a, cudaStream_t s) {
  constexpr size_t bytes = tc_smem_bytes<D>();
  static bool configured = false;  // the attribute is per kernel and process
  if (!configured) {
    cudaFuncSetAttribute(attention_tc_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    configured = true;
  }
  const int G = a.heads / a.kv_heads;
  const dim3 grid(blocks_for(a.T * G, kTcRows), unsigned(a.kv_heads), unsigned(a.splits));
  launch_k(attention_tc_kernel<D, KV>, grid, kTcThreads, bytes, s, a);
}

// The tensor-core kernel: asked for (bf16 mode), not batched decode, at least one full block of rows.
bool takes_tensor_cores(const AttentionArgs& a) {
  const bool dim_ok = a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256;
  return a.tensor_cores && !a.batch && dim_ok && a.T * (a.heads / a.kv_heads) >= kTcRows;
}

template <typename KV>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  const int row_elems = a.kv_heads * a.head_dim;
  const int64_t writes = a.T * row_elems / 4;
  if (a.k_new)
    launch_k(kv_write_kernel<KV>, blocks_for(writes, 256), 256, 0, s, a.k_new, a.v_new, a.T, row_elems,
             a.start_pos, a.pages, a.page_size, a.k_cache, a.v_cache, a.k_scale, a.v_scale);
  if (takes_tensor_cores(a)) {
    switch (a.head_dim) {
      case 64:
        launch_tc_for<64, KV>(a, s);
        break;
      case 128:
        launch_tc_for<128, KV>(a, s);
        break;
      default:
        launch_tc_for<256, KV>(a, s);
        break;
    }
    return;
  }
  if (takes_decode_tensor_cores(a)) {
    switch (a.head_dim) {
      case 64:
        launch_decode_tc_for<64, KV>(a, s);
        break;
      case 128:
        launch_decode_tc_for<128, KV>(a, s);
        break;
      default:
        launch_decode_tc_for<256, KV>(a, s);
        break;
    }
    return;
  }
  if (takes_decode_kernel(a)) {
    switch (a.head_dim) {
      case 32:
        launch_decode_for<32, KV>(a, s);
        break;
      case 64:
        launch_decode_for<64, KV>(a, s);
        break;
      case 128:
        launch_decode_for<128, KV>(a, s);
        break;
      default:
        launch_decode_for<256, KV>(a, s);
        break;
    }
    return;
  }
  switch (a.head_dim) {
    case 32:
      launch_for<32, KV>(a, s);
      break;
    case 64:
      launch_for<64, KV>(a, s);
      break;
    case 128:
      launch_for<128, KV>(a, s);
      break;
    default:
      launch_for<256, KV>(a, s);
      break;
  }
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int attention_splits(int64_t T, int heads, int kv_heads, int64_t capacity) {
  const int64_t blocks = (T * (heads / kv_heads) + kRows - 1) / kRows * kv_heads;
  if (blocks >= 64) return 1;
  return int(std::clamp<int64_t>(capacity / 64, 1, kMaxSplits));  // two key tiles per split at full capacity
}

int attention_decode_splits(int64_t n, int heads, int kv_heads, int64_t capacity) {
  if (heads / kv_heads <= kDecodeMaxGroup) {
    // The decode kernels: one block per (sequence, KV head) streams its keys tile after tile, latency-bound
    // (two or three blocks fit an SM). Split the keys until there are ~512 blocks (about four per SM of an
    // H200, so loads of some overlap others' arithmetic; 264 ran the same), keeping two tiles or more per
    // split (both kernels' tiles are kKeys keys).
    static_assert(kDecTcKeys == kKeys);
    const int64_t blocks = n * kv_heads;
    const int64_t by_keys = (capacity + 2 * kKeys - 1) / (2 * kKeys), by_blocks = (512 + blocks - 1) / blocks;
    return int(std::clamp<int64_t>(std::min(by_keys, by_blocks), 1, kMaxSplits));
  }
  // The general kernel (32-row blocks): aim at ~128 blocks, a key tile or more each.
  const int64_t blocks = n * ((heads / kv_heads + kRows - 1) / kRows) * kv_heads;
  if (blocks >= 64) return 1;
  return int(std::clamp<int64_t>(std::min<int64_t>(capacity / kKeys, 128 / blocks), 1, kMaxSplits));
}

void launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  switch (a.kv_type) {
    case WType::BF16:
      launch_typed<__nv_bfloat16>(a, s);
      break;
    case WType::FP8:
      launch_typed<__nv_fp8_e4m3>(a, s);
      break;
    default:
      launch_typed<float>(a, s);
      break;
  }
  if (a.splits > 1) launch_k(attention_combine_kernel, unsigned(a.T * a.heads), kCombineThreads, 0, s, a);
}

void launch_attention_decode_prep(const float* qg, float* q, float* k, const float* v, int64_t n,
                                  const float* q_norm, const float* k_norm, float eps, int rotary_dim,
                                  const float* inv_freq, const int64_t* rope_positions,
                                  const AttentionArgs& a, cudaStream_t s) {
  if (n == 0) return;
  const dim3 grid(unsigned(a.heads + a.kv_heads), unsigned(n));
  auto launch = [&](auto kernel) {
    launch_k(kernel, grid, 128, 0, s, qg, q, k, v, a.heads, a.kv_heads, a.head_dim, q_norm, k_norm, eps,
             rotary_dim / 2, inv_freq, a.start_pos, rope_positions, a.pages, a.pages_stride, a.page_size,
             a.k_cache, a.v_cache, a.k_scale, a.v_scale);
  };
  switch (a.kv_type) {
    case WType::BF16:
      launch(attention_decode_prep_kernel<__nv_bfloat16>);
      break;
    case WType::FP8:
      launch(attention_decode_prep_kernel<__nv_fp8_e4m3>);
      break;
    default:
      launch(attention_decode_prep_kernel<float>);
      break;
  }
}

}  // namespace moeserve::cuda
