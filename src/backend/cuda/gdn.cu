// Gated DeltaNet kernels: gates, the causal depthwise conv, q/k l2-normalisation and the recurrent delta
// rule (the chunked form is gdn_chunked.cu). The state kernels take the slot's storage type St (float or
// bf16, gdn_state.cuh) as a template parameter.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_state.cuh"

namespace moeserve::cuda {
namespace {

__global__ void gdn_gates_kernel(const float* __restrict__ b, const float* __restrict__ a,
                                 const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                 int64_t n, int v_heads, float* __restrict__ beta, float* __restrict__ g) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int h = int(i % v_heads);
  beta[i] = sigmoidf_(b[i]);
  const float x = a[i] + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch's default threshold
  g[i] = -expf(a_log[h]) * softplus;
}

// One thread per (channel, block of kTokens tokens). Input at time τ < 0 comes from the state, whose column j
// holds time j - (kernel-1). When the launch has a single token block, each thread also advances its
// channel's state (it has read all of it by then); otherwise conv_state_kernel does that afterwards.
constexpr int kConvTokens = 64;
constexpr int kMaxKernel = 8;

// kKernel > 0 fixes the kernel size at compile time (the window then lives in registers).
template <int kKernel, typename St>
__global__ void conv1d_silu_kernel(const float* __restrict__ x, int64_t T, int64_t C,
                                   const float* __restrict__ w, int runtime_kernel, St* state,
                                   float* __restrict__ out) {
  pdl_begin();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int kernel = kKernel > 0 ? kKernel : runtime_kernel;
  const int hist = kernel - 1;
  const int64_t t0 = int64_t(blockIdx.y) * kConvTokens, t1 = imin(T, t0 + kConvTokens);
  St* st = state + c * hist;
  auto input = [&](int64_t tau) { return tau >= 0 ? x[tau * C + c] : state_load(st + tau + hist); };
  float wc[kMaxKernel], win[kMaxKernel];
#pragma unroll
  for (int j = 0; j < (kKernel > 0 ? kKernel : kMaxKernel); ++j)
    if (j < kernel) wc[j] = w[c * kernel + j];
#pragma unroll
  for (int j = 0; j < (kKernel > 0 ? kKernel : kMaxKernel) - 1; ++j)
    if (j < hist) win[j] = input(t0 - hist + j);
  for (int64_t t = t0; t < t1; ++t) {
    win[hist] = x[t * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < (kKernel > 0 ? kKernel : kMaxKernel); ++j)
      if (j < kernel) acc += wc[j] * win[j];
    out[t * C + c] = siluf_(acc);
#pragma unroll
    for (int j = 0; j < (kKernel > 0 ? kKernel : kMaxKernel) - 1; ++j)
      if (j < hist) win[j] = win[j + 1];
  }
  if (gridDim.y == 1) {
    // New state: inputs at times T-hist .. T-1 (from x, or from the old state when T < hist).
    for (int j = 0; j < hist; ++j) {
      const int64_t tau = T - hist + j;  // tau + hist > j: not yet overwritten
      state_store(st + j, tau >= 0 ? x[tau * C + c] : state_load(st + tau + hist));
    }
  }
}

template <typename St>
__global__ void conv_state_kernel(const float* __restrict__ x, int64_t T, int64_t C, int kernel, St* state) {
  pdl_begin();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int hist = kernel - 1;
  St* st = state + c * hist;
  for (int j = 0; j < hist; ++j) {
    const int64_t tau = T - hist + j;
    state_store(st + j, tau >= 0 ? x[tau * C + c] : state_load(st + tau + hist));
  }
}

// One warp per (token, key head): qn = q / ||q|| * q_scale, kn = k / ||k|| (norms with +1e-6 inside the
// root).
__global__ void l2norm_qk_kernel(const float* __restrict__ q, const float* __restrict__ k, int64_t stride,
                                 int64_t T, int heads, int dim, float q_scale, float* __restrict__ qn,
                                 float* __restrict__ kn) {
  pdl_begin();
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= T * heads) return;
  const int64_t t = row / heads;
  const int h = int(row % heads);
  const float* qs = q + t * stride + int64_t(h) * dim;
  const float* ks = k + t * stride + int64_t(h) * dim;
  float sq = 0.0f, sk = 0.0f;
  for (int i = lane; i < dim; i += 32) sq += qs[i] * qs[i], sk += ks[i] * ks[i];
  const float qi = 1.0f / sqrtf(warp_sum(sq) + 1e-6f), ki = 1.0f / sqrtf(warp_sum(sk) + 1e-6f);
  for (int i = lane; i < dim; i += 32) {
    qn[row * dim + i] = qs[i] * qi * q_scale;
    kn[row * dim + i] = ks[i] * ki;
  }
}

// The recurrent gated delta rule. Block = (value head, slab of 32 value columns), 4 warps; lane owns column j
// of the slab, warp w owns state rows i ≡ w (mod 4), so each thread keeps up to 32 state entries in registers
// for the whole sequence. Per token: S *= e^g; kv = Sᵀk; δ = (v − kv)β; S += k ⊗ δ; o = Sᵀq.
constexpr int kDeltaWarps = 4;
constexpr int kDeltaMaxDim = 128;
constexpr int kDeltaRows = kDeltaMaxDim / kDeltaWarps;

template <typename St>
__global__ __launch_bounds__(128) void delta_rule_kernel(const float* __restrict__ qn,
                                                         const float* __restrict__ kn, int k_heads, int dk,
                                                         const float* __restrict__ v, int64_t v_stride,
                                                         int v_heads, int dv, const float* __restrict__ g,
                                                         const float* __restrict__ beta, int64_t T, St* state,
                                                         float* __restrict__ out) {
  pdl_begin();
  __shared__ float ks[kDeltaMaxDim], qs[kDeltaMaxDim];
  __shared__ float red_kv[kDeltaWarps][32], red_o[kDeltaWarps][32];
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = blockIdx.y * 32 + lane;
  const bool col = j < dv;
  const int kh = h / (v_heads / k_heads);
  St* S = state + int64_t(h) * dk * dv;

  float s[kDeltaRows];
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int i = warp + kDeltaWarps * m;
    s[m] = (col && i < dk) ? state_load(S + int64_t(i) * dv + j) : 0.0f;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* kt = kn + (t * k_heads + kh) * dk;
    const float* qt = qn + (t * k_heads + kh) * dk;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ks[i] = kt[i], qs[i] = qt[i];
    const float decay = expf(g[t * v_heads + h]), b = beta[t * v_heads + h];
    const float vj = col ? v[t * v_stride + int64_t(h) * dv + j] : 0.0f;
    __syncthreads();
    float part = 0.0f;
#pragma unroll
    for (int m = 0; m < kDeltaRows; ++m) {
      const int i = warp + kDeltaWarps * m;
      if (i < dk) {
        s[m] *= decay;
        part += s[m] * ks[i];
      }
    }
    red_kv[warp][lane] = part;
    __syncthreads();
    const float kv = red_kv[0][lane] + red_kv[1][lane] + red_kv[2][lane] + red_kv[3][lane];
    const float delta = (vj - kv) * b;
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < kDeltaRows; ++m) {
      const int i = warp + kDeltaWarps * m;
      if (i < dk) {
        s[m] += ks[i] * delta;
        o += s[m] * qs[i];
      }
    }
    red_o[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col)
      out[(t * v_heads + h) * int64_t(dv) + j] =
          red_o[0][lane] + red_o[1][lane] + red_o[2][lane] + red_o[3][lane];
  }
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int i = warp + kDeltaWarps * m;
    if (col && i < dk) state_store(S + int64_t(i) * dv + j, s[m]);
  }
}

// ---- batched decode: n sequences of one token each --------------------------------------------------------
// Conv: thread = (channel, sequence); it owns its channel's state, shifted in place.
template <typename St>
__global__ void gdn_decode_conv_kernel(const float* __restrict__ qkv, int64_t C, const float* __restrict__ w,
                                       int kernel, void* const* __restrict__ states,
                                       float* __restrict__ out) {
  pdl_begin();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (c >= C) return;
  const int hist = kernel - 1;
  St* st = static_cast<St*>(states[i]) + c * hist;
  const float x = qkv[i * C + c];
  float acc = 0.0f;
  for (int j = 0; j < hist; ++j) acc += w[c * kernel + j] * state_load(st + j);
  acc += w[c * kernel + hist] * x;
  out[i * C + c] = siluf_(acc);
  for (int j = 0; j + 1 < hist; ++j) st[j] = st[j + 1];  // stored values move unchanged
  if (hist > 0) state_store(st + hist - 1, x);
}

// Block = (value head, sequence), 4 warps per 32-column slab of the head (the delta_rule_kernel layout, all
// slabs of the head in one block), so that the gated RMSNorm over the head's columns ends the same block.
// Gates, q/k l2-normalisation, one delta-rule step, the norm.
constexpr int kDecodeMaxSlabs = kDeltaMaxDim / 32;
constexpr int kDecodeWarps = kDeltaWarps * kDecodeMaxSlabs;

// The shared memory of one block of the decode layout.
struct DecodeShared {
  float ks[kDeltaMaxDim], qs[kDeltaMaxDim], scratch[32];
  float red_kv[kDecodeWarps][32], red_o[kDecodeWarps][32];
};

// The gates of value head h for the token at gi (= token * v_heads + h): beta = sigmoid(b), the decay
// e^g with g = -exp(a_log) * softplus(a + dt_bias).
struct TokenGates {
  float beta, decay;
};
__device__ __forceinline__ TokenGates gdn_token_gates(const float* __restrict__ b,
                                                      const float* __restrict__ a,
                                                      const float* __restrict__ a_log,
                                                      const float* __restrict__ dt_bias, int h, int64_t gi) {
  const float xg = a[gi] + dt_bias[h];
  const float softplus = xg > 20.0f ? xg : log1pf(expf(xg));
  return {sigmoidf_(b[gi]), expf(-expf(a_log[h]) * softplus)};
}

// One token of one sequence for the block of value head h (gi as above): q/k l2-normalisation of the conv
// output row, one delta-rule step on the thread's state entries s (rows wr + kDeltaWarps * m of column j, in
// registers), and the gated RMSNorm into out[gi * dv + j].
__device__ __forceinline__ void gdn_token_step(const float* __restrict__ row, int k_heads, int dk,
                                               int v_heads, int dv, int h, int64_t gi, TokenGates gates,
                                               const float* __restrict__ z, const float* __restrict__ norm_w,
                                               float eps, float* s, DecodeShared& sh,
                                               float* __restrict__ out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slab = warp / kDeltaWarps, wr = warp % kDeltaWarps;
  const int j = slab * 32 + lane;
  const bool col = j < dv;
  const int kh = h / (v_heads / k_heads);
  const float beta = gates.beta, decay = gates.decay;
  const float* q = row + int64_t(kh) * dk;
  const float* k = row + int64_t(k_heads) * dk + int64_t(kh) * dk;
  const float* v = row + 2 * int64_t(k_heads) * dk + int64_t(h) * dv;

  const int t = threadIdx.x;
  const float qv = t < dk ? q[t] : 0.0f, kv0 = t < dk ? k[t] : 0.0f;
  const float sq = block_sum(qv * qv, sh.scratch);
  const float sk = block_sum(kv0 * kv0, sh.scratch);
  if (t < dk) {
    sh.qs[t] = qv * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(float(dk)));
    sh.ks[t] = kv0 * (1.0f / sqrtf(sk + 1e-6f));
  }
  const float vj = col ? v[j] : 0.0f;
  __syncthreads();  // qs, ks
  float part = 0.0f;
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int r = wr + kDeltaWarps * m;
    if (r < dk) {
      s[m] *= decay;
      part += s[m] * sh.ks[r];
    }
  }
  sh.red_kv[warp][lane] = part;
  __syncthreads();
  float kv = 0.0f;
#pragma unroll
  for (int w = 0; w < kDeltaWarps; ++w) kv += sh.red_kv[slab * kDeltaWarps + w][lane];
  const float delta = (vj - kv) * beta;
  float o = 0.0f;
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int r = wr + kDeltaWarps * m;
    if (r < dk) {
      s[m] += sh.ks[r] * delta;
      o += s[m] * sh.qs[r];
    }
  }
  sh.red_o[warp][lane] = o;
  __syncthreads();
  float oj = 0.0f;
#pragma unroll
  for (int w = 0; w < kDeltaWarps; ++w) oj += sh.red_o[slab * kDeltaWarps + w][lane];
  // Gated RMSNorm over the head's dv outputs (each counted once: by the slab's first warp).
  const float ss = block_sum(wr == 0 && col ? oj * oj : 0.0f, sh.scratch);
  if (wr == 0 && col) {
    const float scale = 1.0f / sqrtf(ss / float(dv) + eps);
    const int64_t o_at = gi * dv + j;
    out[o_at] = norm_w[j] * (oj * scale) * siluf_(z[o_at]);
  }
}

// The thread's entries of a state S [dk][dv] (see gdn_token_step), widened into registers or stored.
template <typename St>
__device__ __forceinline__ void load_state_entries(const St* S, int dk, int dv, float* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = (warp / kDeltaWarps) * 32 + lane, wr = warp % kDeltaWarps;
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int r = wr + kDeltaWarps * m;
    s[m] = (j < dv && r < dk) ? state_load(S + int64_t(r) * dv + j) : 0.0f;
  }
}
template <typename St>
__device__ __forceinline__ void store_state_entries(St* S, int dk, int dv, const float* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = (warp / kDeltaWarps) * 32 + lane, wr = warp % kDeltaWarps;
#pragma unroll
  for (int m = 0; m < kDeltaRows; ++m) {
    const int r = wr + kDeltaWarps * m;
    if (j < dv && r < dk) state_store(S + int64_t(r) * dv + j, s[m]);
  }
}

template <typename St>
__global__ __launch_bounds__(32 * kDecodeWarps) void gdn_decode_delta_kernel(
    const float* __restrict__ conv, int64_t C, int k_heads, int dk, int v_heads, int dv,
    const float* __restrict__ b, const float* __restrict__ a, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, void* const* __restrict__ states, const float* __restrict__ z,
    const float* __restrict__ norm_w, float eps, float* __restrict__ out) {
  __shared__ DecodeShared sh;
  const int h = blockIdx.x;
  const int64_t i = blockIdx.y;
  // Before pdl_wait: the state (last written by an earlier step); the gates (b, a: written by the input
  // projection two kernels back) are complete once this kernel runs (see common.cuh). Only the conv output
  // needs the wait.
  const int64_t gi = i * v_heads + h;
  const TokenGates gates = gdn_token_gates(b, a, a_log, dt_bias, h, gi);
  St* S = static_cast<St*>(states[i]) + int64_t(h) * dk * dv;
  float s[kDeltaRows];
  load_state_entries(S, dk, dv, s);
  pdl_begin();
  gdn_token_step(conv + i * C, k_heads, dk, v_heads, dv, h, gi, gates, z, norm_w, eps, s, sh, out);
  store_state_entries(S, dk, dv, s);
}

// Batched decode with a thread per state column (dk = dv = 128, Qwen3.5's heads): block = (value head,
// sequence) of dv threads; thread j holds column j of the head's state S [dk][dv] in registers, all dk rows,
// so Sᵀk and Sᵀq are sums inside one thread and only the q/k norms and the output norm cross threads: 6
// barriers where gdn_decode_delta_kernel (512 threads, a row slab per warp) has 10, and two items an SM in
// both. cuda_ops_bench gdn, batch 64: 126.6 -> 102.5 µs (fp32 state, 2.7 TB/s), 142.6 -> 79.9 µs (bf16).
//
// kStaged: the head's state travels between global and shared memory as 16-byte vectors (cp.async in,
// plain stores out), the block's threads each copying every dv-th vector, and each thread walks its column
// in shared memory twice (Sᵀk, then the update and Sᵀq) instead of holding it in registers: a column in
// registers takes 255 of them with spills (two blocks an SM), and read straight from global memory a bf16
// column is 128 two-byte loads per thread (64 bytes a warp's load).
template <typename St, int dk, int dv, bool kStaged>
__global__ __launch_bounds__(dv, kStaged ? 4 : 2) void gdn_decode_column_kernel(
    const float* __restrict__ conv, int64_t C, int k_heads, int v_heads, const float* __restrict__ b,
    const float* __restrict__ a, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    void* const* __restrict__ states, const float* __restrict__ z, const float* __restrict__ norm_w,
    float eps, float* __restrict__ out) {
  static_assert(dk == dv, "a thread per column loads q and k too");
  constexpr int kVecs = dk * dv * int(sizeof(St)) / 16, kVecsPerThread = kVecs / dv;
  static_assert(kVecs % dv == 0, "every thread copies the same number of vectors");
  extern __shared__ uint4 staged[];  // kStaged: the head's state as stored, dk rows of dv
  __shared__ float ks[dk], qs[dk], scratch[32];
  const int h = blockIdx.x, j = threadIdx.x;
  const int64_t i = blockIdx.y;
  // Before pdl_wait, as in gdn_decode_delta_kernel: the gates and the state.
  const int64_t gi = i * v_heads + h;
  const TokenGates gates = gdn_token_gates(b, a, a_log, dt_bias, h, gi);
  St* const S = static_cast<St*>(states[i]) + int64_t(h) * dk * dv;
  St* const tile = reinterpret_cast<St*>(staged);
  float st[kStaged ? 1 : dk];
  if constexpr (kStaged) {
    const uint4* src = reinterpret_cast<const uint4*>(S);
#pragma unroll
    for (int v = 0; v < kVecsPerThread; ++v) cp_async16(staged + v * dv + j, src + v * dv + j, true);
    cp_async_commit();
  } else {
#pragma unroll
    for (int r = 0; r < dk; ++r) st[r] = state_load(S + r * dv + j);
  }
  pdl_begin();

  const float* row = conv + i * C;
  const int kh = h / (v_heads / k_heads);
  const float* q = row + int64_t(kh) * dk;
  const float* k = row + int64_t(k_heads) * dk + int64_t(kh) * dk;
  const float qv = q[j], kv0 = k[j];
  const float sq = block_sum(qv * qv, scratch);
  const float sk = block_sum(kv0 * kv0, scratch);
  qs[j] = qv * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(float(dk)));
  ks[j] = kv0 * (1.0f / sqrtf(sk + 1e-6f));
  const float vj = row[2 * int64_t(k_heads) * dk + int64_t(h) * dv + j];
  if constexpr (kStaged) cp_async_wait<0>();
  __syncthreads();  // qs, ks; the staged state
  float kv = 0.0f, o = 0.0f;
  if constexpr (kStaged) {
    // Pass 1 reads the column, pass 2 reads it again (the decay recomputed alike) and writes it back. Each
    // thread reads and writes only its own column, so the passes need no barrier; partial unrolling keeps
    // the compiler from hoisting every shared load at once (it spilled with the loops unrolled whole).
#pragma unroll 16
    for (int r = 0; r < dk; ++r) kv += state_load(tile + r * dv + j) * gates.decay * ks[r];
    const float delta = (vj - kv) * gates.beta;
#pragma unroll 16
    for (int r = 0; r < dk; ++r) {
      const float x = state_load(tile + r * dv + j) * gates.decay + ks[r] * delta;
      o += x * qs[r];
      state_store(tile + r * dv + j, x);
    }
  } else {
#pragma unroll
    for (int r = 0; r < dk; ++r) {
      st[r] *= gates.decay;
      kv += st[r] * ks[r];
    }
    const float delta = (vj - kv) * gates.beta;
#pragma unroll
    for (int r = 0; r < dk; ++r) {
      st[r] += ks[r] * delta;
      o += st[r] * qs[r];
    }
  }
  const float ss = block_sum(o * o, scratch);
  const int64_t o_at = gi * dv + j;
  out[o_at] = norm_w[j] * (o * (1.0f / sqrtf(ss / float(dv) + eps))) * siluf_(z[o_at]);
  if constexpr (kStaged) {
    // block_sum's barriers have ordered every column's writes before the copy out.
    uint4* dst = reinterpret_cast<uint4*>(S);
#pragma unroll
    for (int v = 0; v < kVecsPerThread; ++v) dst[v * dv + j] = staged[v * dv + j];
  } else {
#pragma unroll
    for (int r = 0; r < dk; ++r) state_store(S + r * dv + j, st[r]);
  }
}

// ---- speculative verify: n sequences of lengths[i] tokens, a state kept after each but the last ----------
// The first trail state of sequence i: the trails before it, one per token after each sequence's first.
__device__ __forceinline__ int64_t first_trail(const int64_t* lengths, int64_t i) {
  int64_t at = 0;
  for (int64_t p = 0; p < i; ++p) at += lengths[p] - 1;
  return at;
}

// Conv: thread = (channel, sequence), the gdn_decode_conv_kernel arithmetic token after token, its window
// in registers in the state's storage type (so each token reads what a decode step would have stored).
template <typename St>
__global__ void gdn_verify_conv_kernel(const float* __restrict__ qkv, int64_t C, const float* __restrict__ w,
                                       int kernel, const int64_t* __restrict__ first_rows,
                                       const int64_t* __restrict__ lengths, void* const* __restrict__ states,
                                       void* const* __restrict__ trails, float* __restrict__ out) {
  pdl_begin();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (c >= C) return;
  const int hist = kernel - 1;
  const int64_t first = first_rows[i], T = lengths[i], trail = first_trail(lengths, i);
  St* st = static_cast<St*>(states[i]) + c * hist;
  St win[kMaxKernel];
  for (int j = 0; j < hist; ++j) win[j] = st[j];
  for (int64_t t = 0; t < T; ++t) {
    const float x = qkv[(first + t) * C + c];
    float acc = 0.0f;
    for (int j = 0; j < hist; ++j) acc += w[c * kernel + j] * state_load(&win[j]);
    acc += w[c * kernel + hist] * x;
    out[(first + t) * C + c] = siluf_(acc);
    for (int j = 0; j + 1 < hist; ++j) win[j] = win[j + 1];
    if (hist > 0) state_store(&win[hist - 1], x);
    if (t + 1 < T) {
      St* kept = static_cast<St*>(trails[trail + t]) + c * hist;
      for (int j = 0; j < hist; ++j) kept[j] = win[j];
    }
  }
  for (int j = 0; j < hist; ++j) st[j] = win[j];
}

// Delta rule: block = (value head, sequence) as gdn_decode_delta_kernel, the state in registers across the
// sequence's tokens, rounded through the storage type after each (what a decode step stores and the next
// reads), and written to the token's trail state but after the last.
template <typename St>
__global__ __launch_bounds__(32 * kDecodeWarps) void gdn_verify_delta_kernel(
    const float* __restrict__ conv, int64_t C, int k_heads, int dk, int v_heads, int dv,
    const float* __restrict__ b, const float* __restrict__ a, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const int64_t* __restrict__ first_rows,
    const int64_t* __restrict__ lengths, void* const* __restrict__ states, void* const* __restrict__ trails,
    const float* __restrict__ z, const float* __restrict__ norm_w, float eps, float* __restrict__ out) {
  __shared__ DecodeShared sh;
  const int h = blockIdx.x;
  const int64_t i = blockIdx.y;
  const int64_t head = int64_t(h) * dk * dv;
  St* S = static_cast<St*>(states[i]) + head;
  float s[kDeltaRows];
  load_state_entries(S, dk, dv, s);
  pdl_begin();
  const int64_t first = first_rows[i], T = lengths[i], trail = first_trail(lengths, i);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = first + t;
    const int64_t gi = r * v_heads + h;
    gdn_token_step(conv + r * C, k_heads, dk, v_heads, dv, h, gi,
                   gdn_token_gates(b, a, a_log, dt_bias, h, gi), z, norm_w, eps, s, sh, out);
#pragma unroll
    for (int m = 0; m < kDeltaRows; ++m) {
      St rounded;
      state_store(&rounded, s[m]);
      s[m] = state_load(&rounded);
    }
    if (t + 1 < T) store_state_entries(static_cast<St*>(trails[trail + t]) + head, dk, dv, s);
    __syncthreads();  // the next token's block_sum reuses sh.scratch
  }
  store_state_entries(S, dk, dv, s);
}

// The staged column kernel from this many sequences (MOESERVE_CUDA_GDN_STAGED_MIN): below, the grid is a
// wave or two and the register kernel's shorter blocks win (cuda_ops_bench gdn, docs/cuda.md).
int64_t gdn_staged_min_batch() {
  static const int64_t v = [] {
    const char* e = std::getenv("MOESERVE_CUDA_GDN_STAGED_MIN");
    return e ? std::atoll(e) : int64_t(64);
  }();
  return v;
}

template <typename St, typename... Args>
void launch_gdn_column(dim3 grid, bool aligned_states, cudaStream_t s, Args&&... args) {
  if (!aligned_states || grid.y < gdn_staged_min_batch()) {
    launch_k(gdn_decode_column_kernel<St, 128, 128, false>, grid, 128, 0, s, std::forward<Args>(args)...);
    return;
  }
  constexpr size_t bytes = 128 * 128 * sizeof(St);
  static const bool sized = [] {  // above the 48 KB default for float32 states
    return cudaFuncSetAttribute(gdn_decode_column_kernel<St, 128, 128, true>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
  }();
  (void)sized;
  launch_k(gdn_decode_column_kernel<St, 128, 128, true>, grid, 128, bytes, s, std::forward<Args>(args)...);
}

}  // namespace

void launch_gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T,
                      int v_heads, float* beta, float* g, cudaStream_t s) {
  const int64_t n = T * v_heads;
  if (n == 0) return;
  launch_k(gdn_gates_kernel, blocks_for(n, 256), 256, 0, s, b, a, a_log, dt_bias, n, v_heads, beta, g);
}

template <typename St>
void conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel, St* state,
                 float* out, cudaStream_t s) {
  const unsigned token_blocks = unsigned((T + kConvTokens - 1) / kConvTokens);
  const dim3 grid(blocks_for(channels, 128), token_blocks);
  if (kernel == 4)
    launch_k(conv1d_silu_kernel<4, St>, grid, 128, 0, s, x, T, channels, w, kernel, state, out);
  else
    launch_k(conv1d_silu_kernel<0, St>, grid, 128, 0, s, x, T, channels, w, kernel, state, out);
  if (token_blocks > 1)
    launch_k(conv_state_kernel<St>, blocks_for(channels, 128), 128, 0, s, x, T, channels, kernel, state);
}

void launch_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel, void* state,
                        StateType state_type, float* out, cudaStream_t s) {
  if (T == 0) return;
  if (state_type == StateType::BF16)
    conv1d_silu(x, T, channels, w, kernel, static_cast<__nv_bfloat16*>(state), out, s);
  else
    conv1d_silu(x, T, channels, w, kernel, static_cast<float*>(state), out, s);
}

void launch_l2norm_qk(const float* q, const float* k, int64_t stride, int64_t T, int k_heads, int dim,
                      float q_scale, float* qn, float* kn, cudaStream_t s) {
  const int64_t rows = T * k_heads;
  if (rows == 0) return;
  launch_k(l2norm_qk_kernel, blocks_for(rows * 32, 256), 256, 0, s, q, k, stride, T, k_heads, dim, q_scale,
           qn, kn);
}

void launch_delta_rule(const float* qn, const float* kn, int k_heads, int k_dim, const float* v,
                       int64_t v_stride, int v_heads, int v_dim, const float* g, const float* beta, int64_t T,
                       void* state, StateType state_type, float* out, cudaStream_t s) {
  const dim3 grid(unsigned(v_heads), unsigned((v_dim + 31) / 32));
  if (state_type == StateType::BF16)
    launch_k(delta_rule_kernel<__nv_bfloat16>, grid, 32 * kDeltaWarps, 0, s, qn, kn, k_heads, k_dim, v,
             v_stride, v_heads, v_dim, g, beta, T, static_cast<__nv_bfloat16*>(state), out);
  else
    launch_k(delta_rule_kernel<float>, grid, 32 * kDeltaWarps, 0, s, qn, kn, k_heads, k_dim, v, v_stride,
             v_heads, v_dim, g, beta, T, static_cast<float*>(state), out);
}

bool gdn_decode_supported(int k_dim, int v_dim, int kernel) {
  return k_dim <= kDeltaMaxDim && v_dim <= 32 * kDecodeMaxSlabs && kernel >= 1 && kernel <= kMaxKernel;
}

void launch_gdn_verify(const float* qkv, const float* z, const float* b, const float* a, int64_t n,
                       const int64_t* first_rows, const int64_t* lengths, int k_heads, int k_dim, int v_heads,
                       int v_dim, const float* conv_w, int kernel, const float* a_log, const float* dt_bias,
                       const float* norm_w, float eps, void* const* conv_states, void* const* states,
                       void* const* conv_trails, void* const* trails, StateType state_type, float* conv,
                       float* out, cudaStream_t s) {
  if (n == 0) return;
  const int64_t C = 2 * int64_t(k_heads) * k_dim + int64_t(v_heads) * v_dim;
  const dim3 conv_grid{blocks_for(C, 128), unsigned(n)}, delta_grid{unsigned(v_heads), unsigned(n)};
  const int threads = 32 * kDeltaWarps * ((v_dim + 31) / 32);
  if (state_type == StateType::BF16) {
    launch_k(gdn_verify_conv_kernel<__nv_bfloat16>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel, first_rows,
             lengths, conv_states, conv_trails, conv);
    launch_k(gdn_verify_delta_kernel<__nv_bfloat16>, delta_grid, threads, 0, s, conv, C, k_heads, k_dim,
             v_heads, v_dim, b, a, a_log, dt_bias, first_rows, lengths, states, trails, z, norm_w, eps, out);
  } else {
    launch_k(gdn_verify_conv_kernel<float>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel, first_rows, lengths,
             conv_states, conv_trails, conv);
    launch_k(gdn_verify_delta_kernel<float>, delta_grid, threads, 0, s, conv, C, k_heads, k_dim, v_heads,
             v_dim, b, a, a_log, dt_bias, first_rows, lengths, states, trails, z, norm_w, eps, out);
  }
}

void launch_gdn_decode(const float* qkv, const float* z, const float* b, const float* a, int64_t n,
                       int k_heads, int k_dim, int v_heads, int v_dim, const float* conv_w, int kernel,
                       const float* a_log, const float* dt_bias, const float* norm_w, float eps,
                       void* const* conv_states, void* const* states, StateType state_type,
                       bool aligned_states, float* conv, float* out, cudaStream_t s) {
  if (n == 0) return;
  const int64_t C = 2 * int64_t(k_heads) * k_dim + int64_t(v_heads) * v_dim;
  const dim3 conv_grid{blocks_for(C, 128), unsigned(n)}, delta_grid{unsigned(v_heads), unsigned(n)};
  if (k_dim == 128 && v_dim == 128) {  // Qwen3.5's heads; other shapes take the 512-thread kernel
    if (state_type == StateType::BF16) {
      launch_k(gdn_decode_conv_kernel<__nv_bfloat16>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel,
               conv_states, conv);
      launch_gdn_column<__nv_bfloat16>(delta_grid, aligned_states, s, conv, C, k_heads, v_heads, b, a, a_log,
                                       dt_bias, states, z, norm_w, eps, out);
    } else {
      launch_k(gdn_decode_conv_kernel<float>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel, conv_states,
               conv);
      launch_gdn_column<float>(delta_grid, aligned_states, s, conv, C, k_heads, v_heads, b, a, a_log, dt_bias,
                               states, z, norm_w, eps, out);
    }
    return;
  }
  const int threads = 32 * kDeltaWarps * ((v_dim + 31) / 32);
  if (state_type == StateType::BF16) {
    launch_k(gdn_decode_conv_kernel<__nv_bfloat16>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel, conv_states,
             conv);
    launch_k(gdn_decode_delta_kernel<__nv_bfloat16>, delta_grid, threads, 0, s, conv, C, k_heads, k_dim,
             v_heads, v_dim, b, a, a_log, dt_bias, states, z, norm_w, eps, out);
  } else {
    launch_k(gdn_decode_conv_kernel<float>, conv_grid, 128, 0, s, qkv, C, conv_w, kernel, conv_states, conv);
    launch_k(gdn_decode_delta_kernel<float>, delta_grid, threads, 0, s, conv, C, k_heads, k_dim, v_heads,
             v_dim, b, a, a_log, dt_bias, states, z, norm_w, eps, out);
  }
}

}  // namespace moeserve::cuda
