// Paged causal attention (GQA) in float32 over a cache of float32, bf16 or FP8 E4M3: new K/V rows are
// rounded into their pages, then a flash-style kernel streams key tiles through shared memory with an online
// softmax, widening the stored elements to float32 in registers as it loads each tile. A block takes 32 query
// rows (token × head of one KV group) and one KV head, so each K/V tile it loads serves the whole group;
// decode-sized calls split the key range over blocks (split-K) and a second kernel combines the partial
// results.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kRows = 32;  // query rows per block
constexpr int kKeys = 32;  // keys per tile
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
  const int row_floats = a.kv_heads * D;
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
      if constexpr (kCols >= 4) {
#pragma unroll
        for (int q = 0; q < kCols / 4; ++q) {
          const float4 v4 = *reinterpret_cast<const float4*>(Vs + j * LD + (q * 32 + pc) * 4);
          v[4 * q] = v4.x, v[4 * q + 1] = v4.y, v[4 * q + 2] = v4.z, v[4 * q + 3] = v4.w;
        }
      } else {
#pragma unroll
        for (int q = 0; q < kCols; ++q) v[q] = Vs[j * LD + q * 32 + pc];
      }
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
    auto column = [&](int c) { return kCols >= 4 ? ((c / 4) * 32 + pc) * 4 + c % 4 : c * 32 + pc; };
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

// One block per output row: weights e^(m_s − M) over the splits.
__global__ void attention_combine_kernel(AttentionArgs a) {
  pdl_begin();
  const int64_t rows = a.T * a.heads, row = blockIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, a.part_m[s * rows + row]);
  float total = 0.f;
  for (int s = 0; s < a.splits; ++s) {
    const float m = a.part_m[s * rows + row];
    if (m != -INFINITY) total += expf(m - M) * a.part_l[s * rows + row];
  }
  for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) {
    float o = 0.f;
    for (int s = 0; s < a.splits; ++s) {
      const float m = a.part_m[s * rows + row];
      if (m != -INFINITY) o += expf(m - M) * a.part_out[(s * rows + row) * a.head_dim + c];
    }
    a.out[row * a.head_dim + c] = o / total;
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

template <typename KV>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  const int row_elems = a.kv_heads * a.head_dim;
  const int64_t writes = a.T * row_elems / 4;
  if (a.k_new)
    launch_k(kv_write_kernel<KV>, blocks_for(writes, 256), 256, 0, s, a.k_new, a.v_new, a.T, row_elems,
             a.start_pos, a.pages, a.page_size, a.k_cache, a.v_cache, a.k_scale, a.v_scale);
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
  return int(std::clamp<int64_t>(capacity / 64, 1, 128));  // two key tiles per split at full capacity
}

int attention_decode_splits(int64_t n, int heads, int kv_heads, int64_t capacity) {
  // A decode block is latency-bound (one query row per head of the group): aim at ~128 blocks, a key tile
  // or more each.
  const int64_t blocks = n * ((heads / kv_heads + kRows - 1) / kRows) * kv_heads;
  if (blocks >= 64) return 1;
  return int(std::clamp<int64_t>(std::min<int64_t>(capacity / kKeys, 128 / blocks), 1, 128));
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
  if (a.splits > 1) launch_k(attention_combine_kernel, unsigned(a.T * a.heads), 128, 0, s, a);
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
