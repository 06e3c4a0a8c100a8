// The vision tower's ops (Backend::add_bias, layer_norm, gelu, rope_table, segment_attention): row and
// elementwise kernels, and bidirectional attention within segments (one image's patches each, any lengths in
// one batch) in two forms:
//  - float32 SIMT (exact mode): a warp per query row, 32-key tiles of K and V in shared memory, an online
//    softmax in float32;
//  - bf16 tensor cores (mma.sync m16n8k16, float32 accumulation and softmax), flash-attention style: q, k, v
//    are first rewritten as bf16 [heads][rows][DP] (head_dim padded with zeros to DP, a multiple of 16: the
//    real tower's 72 becomes 80), then each block of 4 warps takes 64 query rows of one head and walks the
//    segment's keys in 64-row tiles, double-buffered by cp.async; scores stay in registers and become the
//    bf16 A operand of P·V without touching shared memory.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_bias_kernel(float* __restrict__ x, const float* __restrict__ bias, int64_t n,
                                int64_t dim) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += bias[i % dim];
}

// One block per row; mean, then the biased variance around it (two passes over the row, as the CPU does).
// out may alias x: each element is read and then written by the same thread after both reductions.
__global__ void layer_norm_kernel(const float* x, int64_t dim, const float* __restrict__ w,
                                  const float* __restrict__ b, float eps, float* out) {
  pdl_begin();
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
  const float mean = block_sum(sum, scratch) / float(dim);
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = xr[i] - mean;
    sq += d * d;
  }
  const float inv = 1.0f / sqrtf(block_sum(sq, scratch) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// k_tanh = sqrt(2/π) as the CPU computes it in float (passed in, so both round it the same way).
__global__ void gelu_kernel(float* __restrict__ x, int64_t n, bool tanh_approx, float k_tanh) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = tanh_approx ? 0.5f * v * (1.0f + tanhf(k_tanh * (v + 0.044715f * v * v * v)))
                       : 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}

// One thread per rotated pair (row, head, j < half).
__global__ void rope_table_kernel(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                                  int half, const float* __restrict__ cos, const float* __restrict__ sin) {
  pdl_begin();
  const int64_t n = rows * heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const int64_t rh = i / half, r = rh / heads;
    float* v = x + r * row_stride + int64_t(rh % heads) * head_dim;
    const float c = cos[r * half + j], s = sin[r * half + j], a = v[j], b = v[j + half];
    v[j] = a * c - b * s;
    v[j + half] = b * c + a * s;
  }
}

// ---- float32 SIMT attention
// --------------------------------------------------------------------------------
constexpr int kSimtWarps = kSegmentTileRowsSimt;  // a warp per query row of the tile
constexpr int kSimtKeys = 32;                     // a key per lane per tile
constexpr int kSimtMaxPerLane = 8;                // head_dim ≤ 256

size_t simt_smem_bytes(int D) {
  // K tile [32][D+1] (odd pitch: lane j reads row j without bank conflicts), V tile [32][D], q rows [8][D].
  return size_t(kSimtKeys * (D + 1) + kSimtKeys * D + kSimtWarps * D) * sizeof(float);
}

__global__ __launch_bounds__(kSimtWarps * 32) void segment_attention_simt_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int64_t stride,
    int heads, int D, float scale, const SegmentTile* __restrict__ tiles, float* __restrict__ out) {
  pdl_begin();
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + kSimtKeys * (D + 1);
  float* qs = vs + kSimtKeys * D;
  const SegmentTile t = tiles[blockIdx.x];
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(t.q0) + warp;
  const bool active = row < t.q1;  // inactive warps still take part in the block's barriers
  float* qw = qs + warp * D;
  for (int d = lane; d < D; d += 32) qw[d] = active ? q[row * stride + int64_t(h) * D + d] * scale : 0.0f;
  float o[kSimtMaxPerLane];
#pragma unroll
  for (int c = 0; c < kSimtMaxPerLane; ++c) o[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = t.lo; j0 < t.hi; j0 += kSimtKeys) {
    const int valid = int(imin<int64_t>(kSimtKeys, t.hi - j0));
    __syncthreads();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < kSimtKeys * D; i += blockDim.x) {
      const int r = i / D, d = i % D;
      const int64_t at = (j0 + r) * stride + int64_t(h) * D + d;
      ks[r * (D + 1) + d] = r < valid ? k[at] : 0.0f;
      vs[r * D + d] = r < valid ? v[at] : 0.0f;
    }
    __syncthreads();
    float s = -INFINITY;
    if (lane < valid) {
      s = 0.0f;
      const float* kr = ks + lane * (D + 1);
      for (int d = 0; d < D; ++d) s += qw[d] * kr[d];
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    const float p = lane < valid ? expf(s - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < kSimtMaxPerLane; ++c) o[c] *= corr;
    for (int j = 0; j < valid; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int c = 0; c < kSimtMaxPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < D) o[c] += pj * vs[j * D + d];
      }
    }
  }
  if (!active) return;
  float* orow = out + row * int64_t(heads) * D + int64_t(h) * D;
#pragma unroll
  for (int c = 0; c < kSimtMaxPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < D) orow[d] = o[c] / l;
  }
}

// ---- bf16 tensor-core attention
// ----------------------------------------------------------------------------
using bf16 = __nv_bfloat16;
constexpr int kMmaRows = kSegmentTileRowsMma;  // query rows per block: 16 per warp
constexpr int kMmaKeys = 64;                   // keys per tile
constexpr int kMmaThreads = 128;

// q, k, v rows (stride floats apart, heads of D) -> bf16 [heads][rows][DP], columns D..DP-1 zero. One thread
// per column pair.
__global__ void to_heads_bf16_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                     const float* __restrict__ v, int64_t rows, int64_t stride, int heads,
                                     int D, int DP, bf16* __restrict__ qb, bf16* __restrict__ kb,
                                     bf16* __restrict__ vb) {
  pdl_begin();
  const int pairs = DP / 2;
  const int64_t n = rows * heads * pairs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int d = 2 * int(i % pairs);
    const int64_t r = i / pairs / heads;
    const int h = int(i / pairs % heads);
    const int64_t src = r * stride + int64_t(h) * D + d;
    const int64_t dst = (int64_t(h) * rows + r) * DP + d;
    const float* in[3] = {q, k, v};
    bf16* outs[3] = {qb, kb, vb};
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      const float a = d < D ? in[m][src] : 0.0f, b = d + 1 < D ? in[m][src + 1] : 0.0f;
      *reinterpret_cast<__nv_bfloat162*>(outs[m] + dst) = __floats2bfloat162_rn(a, b);
    }
  }
}

// Shared rows of DP + 8 bf16: (DP + 8) / 8 is odd, so the 8 rows one ldmatrix reads start in 8 distinct
// 16-byte bank groups.
template <int DP>
constexpr int mma_pitch() {
  return DP + 8;
}
template <int DP>
constexpr size_t mma_smem_bytes() {
  return size_t(kMmaRows + 4 * kMmaKeys) * mma_pitch<DP>() * sizeof(bf16);  // Q, then K and V twice
}

template <int DP>
__global__ __launch_bounds__(kMmaThreads) void segment_attention_mma_kernel(
    const bf16* __restrict__ qb, const bf16* __restrict__ kb, const bf16* __restrict__ vb, int64_t rows,
    int heads, int D, float scale_log2, const SegmentTile* __restrict__ tiles, float* __restrict__ out) {
  constexpr int P = mma_pitch<DP>(), kChunks = DP / 8, kSteps = DP / 16, kDTiles = DP / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* ks = qs + kMmaRows * P;  // [2][kMmaKeys][P]
  bf16* vs = ks + 2 * kMmaKeys * P;
  pdl_begin();
  const SegmentTile t = tiles[blockIdx.x];
  const int h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bf16* qh = qb + int64_t(h) * rows * DP;
  const bf16* kh = kb + int64_t(h) * rows * DP;
  const bf16* vh = vb + int64_t(h) * rows * DP;
  // 64 rows from r0 into a shared tile; rows at or past `end` are zero-filled (r0 < end always).
  auto load = [&](bf16* dst, const bf16* src, int64_t r0, int64_t end) {
    for (int c = tid; c < 64 * kChunks; c += kMmaThreads) {
      const int r = c / kChunks, ch = c % kChunks;
      const bool valid = r0 + r < end;
      cp_async16(dst + r * P + ch * 8, src + (valid ? r0 + r : r0) * DP + ch * 8, valid);
    }
  };
  const int64_t keys = int64_t(t.hi) - t.lo;
  const int tiles_n = int((keys + kMmaKeys - 1) / kMmaKeys);
  load(qs, qh, t.q0, t.q1);
  load(ks, kh, t.lo, t.hi);
  load(vs, vh, t.lo, t.hi);
  cp_async_commit();

  const int g = lane >> 2, tq = lane & 3;
  uint32_t qf[kSteps][4];
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < tiles_n; ++j) {
    const int buf = j & 1;
    if (j + 1 < tiles_n) {
      const int64_t next = t.lo + int64_t(j + 1) * kMmaKeys;
      load(ks + (buf ^ 1) * kMmaKeys * P, kh, next, t.hi);
      load(vs + (buf ^ 1) * kMmaKeys * P, vh, next, t.hi);
    }
    cp_async_commit();  // possibly empty: wait_group 1 then always means "all but the next tile"
    cp_async_wait<1>();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk)
        ldmatrix_x4(qf[kk],
                    qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + kk * 16 + (lane >> 4) * 8);
    }
    const bf16* kt = ks + buf * kMmaKeys * P;
    const bf16* vt = vs + buf * kMmaKeys * P;

    // S = Q Kᵀ for the warp's 16 rows and the tile's 64 keys: 8 n-tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, kt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * P + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(s[2 * np], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
      }

    // Online softmax in base 2: this thread holds rows g (c = 0, 1) and g + 8 (c = 2, 3) of 16 keys.
    const int64_t key0 = t.lo + int64_t(j) * kMmaKeys;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool valid = key0 + nt * 8 + 2 * tq + (c & 1) < t.hi;
        s[nt][c] = valid ? s[nt][c] * scale_log2 : -INFINITY;
        mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // finite: every tile holds a valid key
      const float corr = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) o[dt][2 * r] *= corr, o[dt][2 * r + 1] *= corr;
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[nt][c] = exp2f(s[nt][c] - m[c >> 1]);
        l[c >> 1] += s[nt][c];
      }

      // O += P V: the score accumulators of keys 16kk..16kk+15 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t a[4] = {bf16x2_bits(s[2 * kk][0], s[2 * kk][1]), bf16x2_bits(s[2 * kk][2], s[2 * kk][3]),
                             bf16x2_bits(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             bf16x2_bits(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kSteps; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + dp * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * dp], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_bf16(o[2 * dp + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    __syncthreads();  // this tile's buffers are refilled by the next iteration's loads
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = int64_t(t.q0) + warp * 16 + g + 8 * r;
    if (row >= t.q1) continue;
    float* orow = out + row * int64_t(heads) * D + int64_t(h) * D;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int d = dt * 8 + 2 * tq;
      if (d < D) orow[d] = o[dt][2 * r] * inv;
      if (d + 1 < D) orow[d + 1] = o[dt][2 * r + 1] * inv;
    }
  }
}

template <int DP>
void launch_mma(const SegmentAttentionArgs& a, cudaStream_t s) {
  constexpr size_t bytes = mma_smem_bytes<DP>();
  static bool configured = false;  // the attribute is per kernel and process
  if (!configured) {
    cudaFuncSetAttribute(segment_attention_mma_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(bytes));
    configured = true;
  }
  const auto* qb = static_cast<const bf16*>(a.scratch);
  const int64_t per = int64_t(a.heads) * a.rows * DP;
  const float scale_log2 = 1.4426950408889634f / sqrtf(float(a.head_dim));
  launch_k(segment_attention_mma_kernel<DP>, dim3(unsigned(a.num_tiles), unsigned(a.heads)), kMmaThreads,
           bytes, s, qb, qb + per, qb + 2 * per, a.rows, a.heads, a.head_dim, scale_log2, a.tiles, a.out);
}

unsigned grid_for(int64_t n) {
  return unsigned(std::min<int64_t>(blocks_for(n, kThreads), int64_t(1) << 20));
}

}  // namespace

void launch_add_bias(float* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t s) {
  const int64_t n = rows * dim;
  if (n == 0) return;
  launch_k(add_bias_kernel, grid_for(n), kThreads, 0, s, x, bias, n, dim);
}

void launch_layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                       float* out, cudaStream_t s) {
  if (rows == 0) return;
  launch_k(layer_norm_kernel, unsigned(rows), kThreads, 0, s, x, dim, w, b, eps, out);
}

void launch_gelu(float* x, int64_t n, bool tanh_approx, float k_tanh, cudaStream_t s) {
  if (n == 0) return;
  launch_k(gelu_kernel, grid_for(n), kThreads, 0, s, x, n, tanh_approx, k_tanh);
}

void launch_rope_table(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, int rotary_dim,
                       const float* cos, const float* sin, cudaStream_t s) {
  const int half = rotary_dim / 2;
  const int64_t n = rows * heads * half;
  if (n == 0) return;
  launch_k(rope_table_kernel, grid_for(n), kThreads, 0, s, x, rows, row_stride, heads, head_dim, half, cos,
           sin);
}

int segment_attention_padded_dim(int head_dim) {
  return (head_dim + 15) / 16 * 16;
}

bool segment_attention_mma_supported(int head_dim) {
  return head_dim >= 16 && head_dim <= 128;
}

size_t segment_attention_scratch_bytes(int64_t rows, int heads, int head_dim, bool tensor_cores) {
  return tensor_cores ? 3 * size_t(rows) * size_t(heads) * size_t(segment_attention_padded_dim(head_dim)) *
                            sizeof(bf16)
                      : 0;
}

void launch_segment_attention(const SegmentAttentionArgs& a, cudaStream_t s) {
  if (a.num_tiles == 0) return;
  if (!a.tensor_cores) {
    const size_t bytes = simt_smem_bytes(a.head_dim);
    static bool configured = false;
    if (!configured) {
      cudaFuncSetAttribute(segment_attention_simt_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(simt_smem_bytes(kSimtMaxPerLane * 32)));
      configured = true;
    }
    launch_k(segment_attention_simt_kernel, dim3(unsigned(a.num_tiles), unsigned(a.heads)), kSimtWarps * 32,
             bytes, s, a.q, a.k, a.v, a.stride, a.heads, a.head_dim, 1.0f / sqrtf(float(a.head_dim)), a.tiles,
             a.out);
    return;
  }
  const int DP = segment_attention_padded_dim(a.head_dim);
  auto* qb = static_cast<bf16*>(a.scratch);
  const int64_t per = int64_t(a.heads) * a.rows * DP;
  launch_k(to_heads_bf16_kernel, grid_for(a.rows * a.heads * (DP / 2)), kThreads, 0, s, a.q, a.k, a.v, a.rows,
           a.stride, a.heads, a.head_dim, DP, qb, qb + per, qb + 2 * per);
  switch (DP) {
    case 16:
      launch_mma<16>(a, s);
      break;
    case 32:
      launch_mma<32>(a, s);
      break;
    case 48:
      launch_mma<48>(a, s);
      break;
    case 64:
      launch_mma<64>(a, s);
      break;
    case 80:
      launch_mma<80>(a, s);
      break;
    case 96:
      launch_mma<96>(a, s);
      break;
    case 112:
      launch_mma<112>(a, s);
      break;
    default:
      launch_mma<128>(a, s);
      break;
  }
}

}  // namespace moeserve::cuda
