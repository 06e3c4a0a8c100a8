// The chunked (WY) form of the gated delta rule for prefill, on bf16 tensor cores (WMMA 16x16x16 tiles, which
// compile to mma.sync m16n8k16) with float32 accumulation; the state is carried in float32.
//
// Per chunk of 64 tokens, with G the in-chunk cumulative log-decay, γ_i = e^{G_i} and D_ij = e^{G_i − G_j}
// (j ≤ i), the recurrence S = S e^g; δ = (v − Sᵀk)β; S += k ⊗ δ; o = Sᵀq (S [dk][dv]) sums to
//   L = strictly_lower(β_i D_ij k_i·k_j),  T = (I + L)⁻¹,  W = T (β γ K),  U = T (β V)
//   δ = U − W S,  O = (γ Q) S + (D ⊙ Q Kᵀ) δ,  S ← γ_last S + (e^{G_last − G} K)ᵀ δ
// (cpu/delta_rule.cpp's delta_rule_chunked, the fla kernels' chunk_gated_delta_rule). Everything on the first
// line is independent of the state: the prep kernel computes it for all chunks and heads at once. The state
// kernel then walks the chunks in order, one block per (value head, 32 value columns): the columns of S are
// independent, so 4 blocks share a head and each keeps its 128x32 slice of S in shared memory.
#include <mma.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_state.cuh"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kChunk = 64;  // tokens per chunk
constexpr int kDim = 128;   // key and value head dim of this path
constexpr int kSlab = 32;   // value columns per state block
// Shared-memory row strides (elements), padded so rows start in different banks; all keep tiles 32-byte
// aligned as WMMA requires.
constexpr int kLdH = kDim + 8;     // bf16 rows of 128
constexpr int kLdCH = kChunk + 8;  // bf16 rows of 64
constexpr int kLdSH = kSlab + 8;   // bf16 rows of 32
constexpr int kLdF = kDim + 4;     // float rows of 128
constexpr int kLdC = kChunk + 4;   // float rows of 64
constexpr int kLdS = kSlab + 4;    // float rows of 32

// Per (chunk, value head), what the prep kernel leaves for the state kernel.
constexpr int64_t kPrepW = int64_t(kChunk) * kDim;    // W, bf16
constexpr int64_t kPrepU = int64_t(kChunk) * kDim;    // U, float
constexpr int64_t kPrepP = int64_t(kChunk) * kChunk;  // D ⊙ Q Kᵀ, bf16
constexpr int64_t kPrepQ = int64_t(kChunk) * kDim;    // γ Q, bf16
constexpr int64_t kPrepK = int64_t(kChunk) * kDim;    // e^{G_last − G} K, bf16

__device__ __forceinline__ void store_bf16x4(bf16* dst, float4 x) {
  auto* d = reinterpret_cast<__nv_bfloat162*>(dst);
  d[0] = __floats2bfloat162_rn(x.x, x.y);
  d[1] = __floats2bfloat162_rn(x.z, x.w);
}

// dst row i (stride ld) = bf16(scale(i) · src row i) for i < len, zeros past it; 64 rows of 128 floats, src
// rows every `stride` floats (16-byte aligned), spread over kUsers threads from `tid`. Each thread issues
// eight loads before it converts any: one at a time, the prep kernel waited on ~16 dependent global loads
// per call (ncu: 69 us a block, 12% of DRAM).
template <int kUsers, typename Scale>
__device__ void rows_to_bf16(const float* __restrict__ src, int64_t stride, int len, Scale scale, bf16* dst,
                             int ld, int tid) {
  constexpr int kVecs = kChunk * kDim / 4, kBatch = 8;
  static_assert(kVecs % (kUsers * kBatch) == 0, "whole batches per thread");
#pragma unroll 1
  for (int e0 = tid; e0 < kVecs; e0 += kUsers * kBatch) {
    float4 x[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e = e0 + b * kUsers, i = e / (kDim / 4), c = (e % (kDim / 4)) * 4;
      x[b] = i < len ? __ldg(reinterpret_cast<const float4*>(src + i * stride + c))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e = e0 + b * kUsers, i = e / (kDim / 4), c = (e % (kDim / 4)) * 4;
      if (i < len) {
        const float sc = scale(i);
        x[b].x *= sc, x[b].y *= sc, x[b].z *= sc, x[b].w *= sc;
      }
      store_bf16x4(dst + i * ld + c, x[b]);
    }
  }
}

// Row tile rt of out (16 rows, column tiles [ct0, ct1), float, stride ldo) = A (row-major, stride lda) · B
// (row-major, stride ldb) over k tiles [0, k_tiles).
__device__ void warp_product(const bf16* a, int lda, const bf16* b, int ldb, int k_tiles, int ct0, int ct1,
                             float* out, int ldo, int rt) {
  for (int ct = ct0; ct < ct1; ++ct) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int s = 0; s < k_tiles; ++s) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, a + rt * 16 * lda + s * 16, lda);
      wmma::load_matrix_sync(fb, b + s * 16 * ldb + ct * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + rt * 16 * ldo + ct * 16, acc, ldo, wmma::mem_row_major);
  }
}

// The prep kernel's warps: 8, two blocks a multiprocessor (ncu on 4: latency-bound at 12% occupancy). Warp w
// owns row tile w % 4 of every 64-row product and half w / 4 of its column tiles (K Kᵀ in one half, Q Kᵀ in
// the other); during the forward substitution (warps 0-1) the three scaled operand sets are converted by
// warps 2-3, 4-5 and 6-7 side by side.
constexpr int kPrepThreads = 256;

constexpr size_t kPrepSmem = 2 * size_t(kChunk) * kLdH * sizeof(bf16)  // keys, queries (then the products)
                             + size_t(kChunk) * kLdC * sizeof(float)   // K Kᵀ → L
                             + size_t(kChunk) * kLdCH * sizeof(bf16)   // T
                             + size_t(kChunk) * kLdH * sizeof(bf16);  // Q Kᵀ (float), then right-hand sides
static_assert(size_t(kChunk) * kLdC * sizeof(float) <= size_t(kChunk) * kLdH * sizeof(bf16),
              "Q Kᵀ fits where the right-hand sides go");

// Block = (chunk, value head).
__global__ __launch_bounds__(kPrepThreads) void gdn_chunk_prep_kernel(
    const float* __restrict__ qn, const float* __restrict__ kn, int k_heads, const float* __restrict__ v,
    int64_t v_stride, int v_heads, const float* __restrict__ g, const float* __restrict__ beta, int64_t T,
    bf16* __restrict__ w_out, float* __restrict__ u_out, bf16* __restrict__ p_out, bf16* __restrict__ q_out,
    bf16* __restrict__ k_out, float* __restrict__ gamma_out) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* kb = reinterpret_cast<bf16*>(smem);                     // [64][kLdH]
  bf16* qb = kb + kChunk * kLdH;                                // [64][kLdH]
  float* prod = reinterpret_cast<float*>(smem);                 // [64][kLdF] over kb, qb once they are read
  float* lower = reinterpret_cast<float*>(qb + kChunk * kLdH);  // [64][kLdC]
  bf16* inv = reinterpret_cast<bf16*>(lower + kChunk * kLdC);   // [64][kLdCH]
  bf16* rhs = inv + kChunk * kLdCH;                             // [64][kLdH]
  float* qk = reinterpret_cast<float*>(rhs);                    // [64][kLdC], read before rhs is written
  __shared__ float gamma[kChunk], bs[kChunk];

  const int tid = threadIdx.x, warp = tid >> 5, rt = warp & 3, half = warp >> 2;
  const int c = blockIdx.x, h = blockIdx.y, kh = h / (v_heads / k_heads);
  const int64_t t0 = int64_t(c) * kChunk;
  const int len = int(imin<int64_t>(kChunk, T - t0));
  const int64_t qk_stride = int64_t(k_heads) * kDim;
  const float* kr = kn + t0 * qk_stride + int64_t(kh) * kDim;
  const float* qr = qn + t0 * qk_stride + int64_t(kh) * kDim;
  const int64_t item = int64_t(c) * v_heads + h;

  if (tid == 0) {  // summed in token order, as the CPU does; padded rows keep the last token's value
    float run = 0.0f;
    for (int i = 0; i < kChunk; ++i) {
      if (i < len) run += g[(t0 + i) * v_heads + h];
      gamma[i] = run;
    }
  }
  if (tid < kChunk) bs[tid] = tid < len ? beta[(t0 + tid) * v_heads + h] : 0.0f;
  const auto one = [](int) { return 1.0f; };
  rows_to_bf16<kPrepThreads>(kr, qk_stride, len, one, kb, kLdH, tid);
  rows_to_bf16<kPrepThreads>(qr, qk_stride, len, one, qb, kLdH, tid);
  __syncthreads();
  if (tid < kChunk) gamma_out[item * kChunk + tid] = gamma[tid];

  // K Kᵀ (half 0) and Q Kᵀ (half 1), the tiles on and below the diagonal only (the rest is masked away).
  {
    const bf16* a = half ? qb : kb;
    float* dst = half ? qk : lower;
    for (int ct = 0; ct <= rt; ++ct) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int s = 0; s < kDim / 16; ++s) {
        FragA fa;
        FragBt bk;  // Kᵀ: column n of the operand is key row n
        wmma::load_matrix_sync(fa, a + rt * 16 * kLdH + s * 16, kLdH);
        wmma::load_matrix_sync(bk, kb + ct * 16 * kLdH + s * 16, kLdH);
        wmma::mma_sync(acc, fa, bk, acc);
      }
      wmma::store_matrix_sync(dst + rt * 16 * kLdC + ct * 16, acc, kLdC, wmma::mem_row_major);
    }
  }
  __syncthreads();

  bf16* p = p_out + item * kPrepP;
  for (int e = tid; e < kChunk * kChunk; e += kPrepThreads) {
    const int i = e / kChunk, j = e % kChunk;
    const float d = j <= i ? expf(gamma[i] - gamma[j]) : 0.0f;
    const float kk = lower[i * kLdC + j], qq = qk[i * kLdC + j];
    lower[i * kLdC + j] = j < i ? bs[i] * d * kk : 0.0f;  // selects: the unwritten tiles never leak in
    p[e] = __float2bfloat16_rn(j <= i ? d * qq : 0.0f);
  }
  __syncthreads();

  if (warp < 2) {
    // T = (I + L)⁻¹ by forward substitution, column j per thread: x_i = [i = j] − Σ_{k<i} L_ik x_k (x_k = 0
    // for k < j falls out by itself). Fully unrolled so x stays in registers; L rows are broadcast reads.
    const int j = tid;
    float x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < i; ++k) acc[k % 4] += lower[i * kLdC + k] * x[k];
      x[i] = (i == j ? 1.0f : 0.0f) - ((acc[0] + acc[1]) + (acc[2] + acc[3]));
      inv[i * kLdCH + j] = __float2bfloat16_rn(x[i]);
    }
  } else if (warp < 4) {  // meanwhile: β γ K (the right-hand side of W; Q Kᵀ is read by now) ...
    rows_to_bf16<64>(
        kr, qk_stride, len, [&](int i) { return bs[i] * expf(gamma[i]); }, rhs, kLdH, tid - 64);
  } else if (warp < 6) {  // ... and the state kernel's γ Q and e^{G_last − G} K
    rows_to_bf16<64>(
        qr, qk_stride, len, [&](int i) { return expf(gamma[i]); }, q_out + item * kPrepQ, kDim, tid - 128);
  } else {
    rows_to_bf16<64>(
        kr, qk_stride, len, [&](int i) { return expf(gamma[kChunk - 1] - gamma[i]); }, k_out + item * kPrepK,
        kDim, tid - 192);
  }
  __syncthreads();

  // W = T (β γ K), then U = T (β V). T is lower triangular: row tile rt needs k tiles ≤ rt.
  constexpr int kHalfTiles = kDim / 32;
  warp_product(inv, kLdCH, rhs, kLdH, rt + 1, half * kHalfTiles, (half + 1) * kHalfTiles, prod, kLdF, rt);
  __syncthreads();
  bf16* w = w_out + item * kPrepW;
  for (int e = tid; e < kChunk * kDim / 4; e += kPrepThreads) {
    const int i = e / (kDim / 4), col = (e % (kDim / 4)) * 4;
    store_bf16x4(w + i * kDim + col, *reinterpret_cast<const float4*>(prod + i * kLdF + col));
  }
  rows_to_bf16<kPrepThreads>(
      v + t0 * v_stride + int64_t(h) * kDim, v_stride, len, [&](int i) { return bs[i]; }, rhs, kLdH, tid);
  __syncthreads();
  warp_product(inv, kLdCH, rhs, kLdH, rt + 1, half * kHalfTiles, (half + 1) * kHalfTiles, prod, kLdF, rt);
  __syncthreads();
  float* u = u_out + item * kPrepU;
  for (int e = tid; e < kChunk * kDim / 4; e += kPrepThreads) {
    const int i = e / (kDim / 4), col = (e % (kDim / 4)) * 4;
    *reinterpret_cast<float4*>(u + i * kDim + col) = *reinterpret_cast<const float4*>(prod + i * kLdF + col);
  }
}

// A chunk's operands of the state kernel, double-buffered: chunk c + 1's are copied (cp.async) while chunk c
// is multiplied, so the walk waits on the copies' latency once rather than once per chunk (the walk is
// serial, one block per SM: waiting on ~28 dependent 16-byte loads per thread per chunk cost 19 us a chunk).
constexpr size_t kOperandsSmem = 3 * size_t(kChunk) * kLdH * sizeof(bf16)  // W, γ Q, e^{G_last − G} K
                                 + size_t(kChunk) * kLdCH * sizeof(bf16)   // D ⊙ Q Kᵀ
                                 + size_t(kChunk) * kLdS * sizeof(float);  // U (this block's columns)
constexpr size_t kStateSmem = size_t(kDim) * kLdS * sizeof(float)          // S (float32)
                              + size_t(kDim) * kLdSH * sizeof(bf16)        // S (bf16 operand)
                              + 2 * kOperandsSmem                          // two chunks' operands
                              + 2 * size_t(kChunk) * kLdS * sizeof(float)  // δ (float32), O
                              + size_t(kChunk) * kLdSH * sizeof(bf16);     // δ (bf16 operand)

// The state kernel's warps: 8, so that its one block per multiprocessor (the operands' double buffer takes
// most of the shared memory) has two warps per scheduler to issue from (with 4, ncu saw one instruction per
// 4 cycles per scheduler). Warp w owns tile (w % 4, w / 4) of the 64 x 32 products and row tile w of S.
constexpr int kStateThreads = 256;

// 16-byte cp.async copies of 64 rows of kBytes (row i at src + i * src_stride bytes) into shared rows of
// stride ld_bytes.
template <int kBytes>
__device__ void copy_rows_async(const void* __restrict__ src, int64_t src_stride, void* dst, int ld_bytes,
                                int tid) {
  constexpr int kVecs = kBytes / 16;
  for (int e = tid; e < kChunk * kVecs; e += kStateThreads) {
    const int i = e / kVecs, c = (e % kVecs) * 16;
    cp_async16(static_cast<char*>(dst) + i * ld_bytes + c, static_cast<const char*>(src) + i * src_stride + c,
               true);
  }
}

struct ChunkOperands {
  bf16 *w, *q, *k, *p;
  float* u;
  __device__ explicit ChunkOperands(unsigned char* base) {
    w = reinterpret_cast<bf16*>(base);                 // [64][kLdH]
    q = w + kChunk * kLdH;                             // [64][kLdH]
    k = q + kChunk * kLdH;                             // [64][kLdH]
    p = k + kChunk * kLdH;                             // [64][kLdCH]
    u = reinterpret_cast<float*>(p + kChunk * kLdCH);  // [64][kLdS]
  }
};

// Block = (value head, slab of 32 value columns); chunks in order.
template <typename St>
__global__ __launch_bounds__(kStateThreads) void gdn_chunk_state_kernel(
    int v_heads, int64_t T, const bf16* __restrict__ w_in, const float* __restrict__ u_in,
    const bf16* __restrict__ p_in, const bf16* __restrict__ q_in, const bf16* __restrict__ k_in,
    const float* __restrict__ gamma_in, St* state, float* __restrict__ out) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  float* s32 = reinterpret_cast<float*>(smem);            // [128][kLdS]
  bf16* sb = reinterpret_cast<bf16*>(s32 + kDim * kLdS);  // [128][kLdSH]
  unsigned char* operands = reinterpret_cast<unsigned char*>(sb + kDim * kLdSH);
  float* d32 = reinterpret_cast<float*>(operands + 2 * kOperandsSmem);  // [64][kLdS]
  float* o32 = d32 + kChunk * kLdS;                                     // [64][kLdS]
  bf16* db = reinterpret_cast<bf16*>(o32 + kChunk * kLdS);              // [64][kLdSH]

  const int tid = threadIdx.x, warp = tid >> 5;
  const int h = blockIdx.x, c0 = blockIdx.y * kSlab;
  const int64_t chunks = (T + kChunk - 1) / kChunk;
  // Starts the copies of chunk c's operands into buffer c % 2 (an empty group past the last chunk, so every
  // iteration waits on the same group count).
  auto fetch = [&](int64_t c) {
    if (c < chunks) {
      const ChunkOperands b(operands + (c & 1) * kOperandsSmem);
      const int64_t item = c * v_heads + h;
      constexpr int kRowH = kDim * int(sizeof(bf16)), kRowC = kChunk * int(sizeof(bf16));
      copy_rows_async<kRowH>(w_in + item * kPrepW, kRowH, b.w, kLdH * int(sizeof(bf16)), tid);
      copy_rows_async<kRowH>(q_in + item * kPrepQ, kRowH, b.q, kLdH * int(sizeof(bf16)), tid);
      copy_rows_async<kRowH>(k_in + item * kPrepK, kRowH, b.k, kLdH * int(sizeof(bf16)), tid);
      copy_rows_async<kRowC>(p_in + item * kPrepP, kRowC, b.p, kLdCH * int(sizeof(bf16)), tid);
      copy_rows_async<kSlab* int(sizeof(float))>(u_in + item * kPrepU + c0, kDim * int(sizeof(float)), b.u,
                                                 kLdS * int(sizeof(float)), tid);
    }
    cp_async_commit();
  };
  fetch(0);
  St* S = state + int64_t(h) * kDim * kDim;
  for (int e = tid; e < kDim * kSlab; e += kStateThreads) {
    const int r = e / kSlab, j = e % kSlab;
    s32[r * kLdS + j] = state_load(S + r * kDim + c0 + j);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t0 = c * kChunk, item = c * v_heads + h;
    const int len = int(imin<int64_t>(kChunk, T - t0));
    __syncthreads();  // S written; the previous chunk's operands (buffer (c + 1) % 2) are read
    fetch(c + 1);
    for (int e = tid; e < kDim * kSlab; e += kStateThreads) {
      const int r = e / kSlab, j = e % kSlab;
      sb[r * kLdSH + j] = __float2bfloat16_rn(s32[r * kLdS + j]);
    }
    const ChunkOperands op(operands + (c & 1) * kOperandsSmem);
    const bf16 *wb = op.w, *qb = op.q, *kt = op.k, *pb = op.p;
    const float decay_all = expf(gamma_in[item * kChunk + kChunk - 1]);
    cp_async_wait<1>();  // this chunk's copies (the next chunk's may still be in flight)
    __syncthreads();

    // δ = U − W S (this warp's 16 x 16 tile), rounded once more as the next products' operand.
    const int rt = warp & 3, ct = warp >> 2;
    {
      FragC ws, d;
      wmma::fill_fragment(ws, 0.0f);
      for (int s = 0; s < kDim / 16; ++s) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, wb + rt * 16 * kLdH + s * 16, kLdH);
        wmma::load_matrix_sync(fb, sb + s * 16 * kLdSH + ct * 16, kLdSH);
        wmma::mma_sync(ws, fa, fb, ws);
      }
      wmma::load_matrix_sync(d, op.u + rt * 16 * kLdS + ct * 16, kLdS, wmma::mem_row_major);
      for (int x = 0; x < d.num_elements; ++x) d.x[x] -= ws.x[x];
      wmma::store_matrix_sync(d32 + rt * 16 * kLdS + ct * 16, d, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = threadIdx.x & 31; e < 16 * 16; e += 32) {
      const int i = rt * 16 + e / 16, j = ct * 16 + e % 16;
      db[i * kLdSH + j] = __float2bfloat16_rn(d32[i * kLdS + j]);
    }
    __syncthreads();

    // O = (γ Q) S + (D ⊙ Q Kᵀ) δ; the second term is causal, so row tile rt takes δ's tiles ≤ rt.
    {
      FragC o;
      wmma::fill_fragment(o, 0.0f);
      for (int s = 0; s < kDim / 16; ++s) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, qb + rt * 16 * kLdH + s * 16, kLdH);
        wmma::load_matrix_sync(fb, sb + s * 16 * kLdSH + ct * 16, kLdSH);
        wmma::mma_sync(o, fa, fb, o);
      }
      for (int s = 0; s <= rt; ++s) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, pb + rt * 16 * kLdCH + s * 16, kLdCH);
        wmma::load_matrix_sync(fb, db + s * 16 * kLdSH + ct * 16, kLdSH);
        wmma::mma_sync(o, fa, fb, o);
      }
      wmma::store_matrix_sync(o32 + rt * 16 * kLdS + ct * 16, o, kLdS, wmma::mem_row_major);
    }
    // S ← γ_last S + (e^{G_last − G} K)ᵀ δ: row tile `warp` of S, both column tiles; float32 throughout.
    for (int c = 0; c < kSlab / 16; ++c) {
      FragC acc;
      wmma::load_matrix_sync(acc, s32 + warp * 16 * kLdS + c * 16, kLdS, wmma::mem_row_major);
      for (int x = 0; x < acc.num_elements; ++x) acc.x[x] *= decay_all;
      for (int s = 0; s < kChunk / 16; ++s) {
        FragAt fa;  // (e^{G_last − G} K)ᵀ: column-major view of the key rows
        FragB fb;
        wmma::load_matrix_sync(fa, kt + s * 16 * kLdH + warp * 16, kLdH);
        wmma::load_matrix_sync(fb, db + s * 16 * kLdSH + c * 16, kLdSH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s32 + warp * 16 * kLdS + c * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = tid; e < len * kSlab / 4; e += kStateThreads) {
      const int i = e / (kSlab / 4), j = (e % (kSlab / 4)) * 4;
      *reinterpret_cast<float4*>(out + ((t0 + i) * v_heads + h) * kDim + c0 + j) =
          *reinterpret_cast<const float4*>(o32 + i * kLdS + j);
    }
  }
  __syncthreads();
  for (int e = tid; e < kDim * kSlab; e += kStateThreads) {
    const int r = e / kSlab, j = e % kSlab;
    state_store(S + r * kDim + c0 + j, s32[r * kLdS + j]);
  }
}

}  // namespace

bool delta_rule_chunked_supported(int k_dim, int v_dim, const float* v, int64_t v_stride) {
  return k_dim == kDim && v_dim == kDim && v_stride % 4 == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0;
}

size_t delta_rule_chunked_scratch_floats(int64_t T, int v_heads) {
  const int64_t items = (T + kChunk - 1) / kChunk * v_heads;
  const int64_t halves = kPrepW + kPrepP + kPrepQ + kPrepK;  // bf16 parts, a multiple of 8 each
  return size_t(items * (halves / 2 + kPrepU + kChunk));
}

void launch_delta_rule_chunked(const float* qn, const float* kn, int k_heads, const float* v,
                               int64_t v_stride, int v_heads, const float* g, const float* beta, int64_t T,
                               void* state, StateType state_type, float* out, float* scratch,
                               cudaStream_t s) {
  if (T == 0) return;
  static const bool configured = [] {
    cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPrepSmem));
    cudaFuncSetAttribute(gdn_chunk_state_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(kStateSmem));
    cudaFuncSetAttribute(gdn_chunk_state_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(kStateSmem));
    return true;
  }();
  (void)configured;
  const int64_t chunks = (T + kChunk - 1) / kChunk, items = chunks * v_heads;
  // Scratch, each part 16-byte aligned: the float parts first, then the bf16 ones.
  float* u = scratch;
  float* gamma = u + items * kPrepU;
  bf16* w = reinterpret_cast<bf16*>(gamma + items * kChunk);
  bf16* p = w + items * kPrepW;
  bf16* q = p + items * kPrepP;
  bf16* k = q + items * kPrepQ;
  launch_k(gdn_chunk_prep_kernel, dim3(unsigned(chunks), unsigned(v_heads)), kPrepThreads, kPrepSmem, s, qn,
           kn, k_heads, v, v_stride, v_heads, g, beta, T, w, u, p, q, k, gamma);
  const dim3 grid(unsigned(v_heads), unsigned(kDim / kSlab));
  if (state_type == StateType::BF16)
    launch_k(gdn_chunk_state_kernel<bf16>, grid, kStateThreads, kStateSmem, s, v_heads, T, w, u, p, q, k,
             gamma, static_cast<bf16*>(state), out);
  else
    launch_k(gdn_chunk_state_kernel<float>, grid, kStateThreads, kStateSmem, s, v_heads, T, w, u, p, q, k,
             gamma, static_cast<float*>(state), out);
}

}  // namespace moeserve::cuda
