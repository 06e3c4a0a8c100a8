// Elementwise and per-row kernels: residual adds, RMSNorm variants, RoPE, embedding, gates, conversions.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// One block per row. out may alias x (each element is read before it is written, by the same thread).
template <bool kZeroCentred>
__global__ void rms_norm_kernel(const float* x, int64_t dim, int64_t x_stride, const float* __restrict__ w,
                                float eps, float* out, int64_t out_stride) {
  pdl_begin();
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * x_stride;
  float* o = out + blockIdx.x * out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float scale = 1.0f / sqrtf(block_sum(ss, scratch) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float wi = kZeroCentred ? 1.0f + w[i] : w[i];
    o[i] = xr[i] * scale * wi;
  }
}

// h += y, then out = zero-centred RMSNorm(h); one block per row.
__global__ void add_rms_norm_kernel(float* h, const float* __restrict__ y, int64_t dim,
                                    const float* __restrict__ w, float eps, float* __restrict__ out) {
  pdl_begin();
  __shared__ float scratch[32];
  float* hr = h + blockIdx.x * dim;
  const float* yr = y + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = hr[i] + yr[i];
    hr[i] = v;
    ss += v * v;
  }
  const float scale = 1.0f / sqrtf(block_sum(ss, scratch) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = hr[i] * scale * (1.0f + w[i]);
}

// The same with float4 accesses, each thread holding up to kNormVec vectors of the row in registers: one
// read of h and y, no second pass over global memory (rows of dim % 4 == 0, dim ≤ 4 * kNormVec * 1024).
constexpr int kNormVec = 4;
__global__ void add_rms_norm_vec_kernel(float* h, const float* __restrict__ y, int64_t dim,
                                        const float* __restrict__ w, float eps, float* __restrict__ out) {
  pdl_begin();
  __shared__ float scratch[32];
  auto* hr = reinterpret_cast<float4*>(h + blockIdx.x * dim);
  const auto* yr = reinterpret_cast<const float4*>(y + blockIdx.x * dim);
  const auto* wr = reinterpret_cast<const float4*>(w);
  auto* o = reinterpret_cast<float4*>(out + blockIdx.x * dim);
  const int n4 = int(dim / 4);
  float4 v[kNormVec];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) {
      const float4 a = hr[i], b = yr[i];
      v[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
  }
  const float scale = 1.0f / sqrtf(block_sum(ss, scratch) / float(dim) + eps);
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) {
      hr[i] = v[k];
      const float4 wi = __ldg(wr + i);
      o[i] = make_float4(v[k].x * scale * (1.0f + wi.x), v[k].y * scale * (1.0f + wi.y),
                         v[k].z * scale * (1.0f + wi.z), v[k].w * scale * (1.0f + wi.w));
    }
  }
}

__global__ void gated_rms_norm_kernel(const float* o, const float* __restrict__ z, int64_t dim,
                                      const float* __restrict__ w, float eps, float* out) {
  pdl_begin();
  __shared__ float scratch[32];
  const float* orow = o + blockIdx.x * dim;
  const float* zrow = z + blockIdx.x * dim;
  float* dst = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += orow[i] * orow[i];
  const float scale = 1.0f / sqrtf(block_sum(ss, scratch) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = w[i] * (orow[i] * scale) * siluf_(zrow[i]);
}

// A warp per row for rows of whole float4s up to 512 floats (the GDN's 128-wide heads: a block per row left
// 31 of 32 threads' work to one warp and made prefill's 262,144 rows latency-bound): each lane keeps its
// float4s of o in registers, so o may be out.
constexpr int kNormWarpRowsPerBlock = 4;
__global__ void gated_rms_norm_warp_kernel(const float* o, const float* __restrict__ z, int64_t rows,
                                           int64_t dim, const float* __restrict__ w, float eps, float* out) {
  pdl_begin();
  const int64_t row = blockIdx.x * int64_t(kNormWarpRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32, vecs = int(dim / 4);
  const auto* orow = reinterpret_cast<const float4*>(o + row * dim);
  const auto* zrow = reinterpret_cast<const float4*>(z + row * dim);
  float4 v[4];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane + 32 * i;
    v[i] = c < vecs ? orow[c] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  const float scale = 1.0f / sqrtf(warp_sum(ss) / float(dim) + eps);
  auto* dst = reinterpret_cast<float4*>(out + row * dim);
  const auto* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane + 32 * i;
    if (c >= vecs) break;
    const float4 g = zrow[c], ww = w4[c];
    dst[c] = make_float4(ww.x * (v[i].x * scale) * siluf_(g.x), ww.y * (v[i].y * scale) * siluf_(g.y),
                         ww.z * (v[i].z * scale) * siluf_(g.z), ww.w * (v[i].w * scale) * siluf_(g.w));
  }
}

int row_threads(int64_t dim) {
  int t = 32;
  while (t < 256 && t * 4 < dim) t *= 2;
  return t;
}

// One thread per (token, head, rotary pair).
__global__ void rope_kernel(float* x, int64_t tokens, int heads, int head_dim, int half,
                            const int64_t* __restrict__ start_pos, const float* __restrict__ inv_freq) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * heads * half) return;
  const int j = int(i % half);
  const int64_t th = i / half, t = th / heads;
  const float angle = float(*start_pos + t) * inv_freq[j];
  const float c = cosf(angle), s = sinf(angle);
  float* v = x + th * head_dim;
  const float a = v[j], b = v[j + half];
  v[j] = a * c - b * s;
  v[j + half] = b * c + a * s;
}

template <WType T>
__global__ void embed_kernel(const int32_t* __restrict__ tokens, WeightView table, float* __restrict__ out) {
  pdl_begin();
  const int64_t row = tokens[blockIdx.x];
  float* o = out + blockIdx.x * table.cols;
  for (int64_t c = threadIdx.x; c < table.cols; c += blockDim.x) o[c] = weight_at<T>(table, row, c);
}

__global__ void mul_sigmoid_kernel(float* x, const float* __restrict__ gate, int64_t rows, int64_t dim,
                                   int64_t gate_stride) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * dim) return;
  const int64_t r = i / dim, c = i % dim;
  x[i] *= sigmoidf_(gate[r * gate_stride + c]);
}

__global__ void add_sigmoid_gated_kernel(float* out, const float* __restrict__ y,
                                         const float* __restrict__ gate, int64_t rows, int64_t dim) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * dim) return;
  out[i] = fmaf(sigmoidf_(gate[i / dim]), y[i], out[i]);
}

__global__ void silu_mul_kernel(const float* __restrict__ g, const float* __restrict__ u, float* out,
                                int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = siluf_(g[i]) * u[i];
}

__global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

// x = hi + mid + lo, each bf16, the rest below 2^-24 |x| (mma_fp8.cuh's three terms, as separate arrays).
__global__ void to_bf16_terms_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ hi,
                                     __nv_bfloat16* __restrict__ mid, __nv_bfloat16* __restrict__ lo,
                                     int64_t n) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float r = x[i];
  const __nv_bfloat16 h = __float2bfloat16_rn(r);
  r -= __bfloat162float(h);
  const __nv_bfloat16 m = __float2bfloat16_rn(r);
  r -= __bfloat162float(m);
  hi[i] = h, mid[i] = m, lo[i] = __float2bfloat16_rn(r);
}

template <WType T>
__global__ void dequant_bf16_kernel(WeightView w, __nv_bfloat16* __restrict__ out) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= w.rows * w.cols) return;
  out[i] = __float2bfloat16_rn(weight_at<T>(w, i / w.cols, i % w.cols));
}

template <WType T>
__global__ void dequant_f32_kernel(WeightView w, float* __restrict__ out) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= w.rows * w.cols) return;
  out[i] = weight_at<T>(w, i / w.cols, i % w.cols);
}

// FP8 rows of whole 16-byte vectors: one vector per thread, its block scale found by a shift (the
// per-element kernel above divides four times per element). The same values: bf16(fp8 * scale).
__global__ void dequant_fp8_vec_kernel(WeightView w, __nv_bfloat16* __restrict__ out) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // vector index
  const int64_t per_row = w.cols / 16;
  if (i >= w.rows * per_row) return;
  const int64_t row = i / per_row;
  const int c = int(i - row * per_row) * 16;
  const float sc = fp8_scale_row(w, row)[c >> fp8_col_shift(w)];
  float f[16];
  fp8x16_to_float(__ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + i * 16)), f);
  uint32_t v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * j] * sc, f[2 * j + 1] * sc);
    v[j] = *reinterpret_cast<const uint32_t*>(&p);
  }
  uint4* o = reinterpret_cast<uint4*>(out + i * 16);
  o[0] = make_uint4(v[0], v[1], v[2], v[3]);
  o[1] = make_uint4(v[4], v[5], v[6], v[7]);
}

// One block per row: the largest value, the lowest index on ties.
__global__ void argmax_kernel(const float* __restrict__ x, int64_t cols, int32_t* __restrict__ out) {
  pdl_begin();
  __shared__ float best_v[32];
  __shared__ int32_t best_i[32];
  const float* row = x + blockIdx.x * cols;
  float v = -INFINITY;
  int32_t idx = INT32_MAX;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    if (row[c] > v) v = row[c], idx = int32_t(c);  // ascending c: the first maximum wins
  auto better = [](float av, int32_t ai, float bv, int32_t bi) { return bv > av || (bv == av && bi < ai); };
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(v, idx, ov, oi)) v = ov, idx = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w)
      if (better(v, idx, best_v[w], best_i[w])) v = best_v[w], idx = best_i[w];
    out[blockIdx.x] = idx == INT32_MAX ? 0 : idx;
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* data, WType type, int64_t n, uint64_t seed, float scale) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed ^ mix64(uint64_t(i))) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = (2.0f * u - 1.0f) * scale;
    switch (type) {
      case WType::F32:
        static_cast<float*>(data)[i] = v;
        break;
      case WType::F16:
        static_cast<__half*>(data)[i] = __float2half_rn(v);
        break;
      case WType::BF16:
        static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
        break;
      case WType::FP8:
        static_cast<__nv_fp8_e4m3*>(data)[i] = __nv_fp8_e4m3(v);
        break;
    }
  }
}

}  // namespace

void launch_add(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_k(add_kernel, unsigned(std::min<int64_t>(blocks_for(n, kThreads), 4096)), kThreads, 0, s, x, y, n);
}

void launch_rms_norm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, float eps,
                     bool zero_centred, float* out, int64_t out_stride, cudaStream_t s) {
  if (rows == 0) return;
  const int t = row_threads(dim);
  if (zero_centred)
    launch_k(rms_norm_kernel<true>, unsigned(rows), t, 0, s, x, dim, x_stride, w, eps, out, out_stride);
  else
    launch_k(rms_norm_kernel<false>, unsigned(rows), t, 0, s, x, dim, x_stride, w, eps, out, out_stride);
}

void launch_add_rms_norm(float* h, const float* y, int64_t rows, int64_t dim, const float* w, float eps,
                         float* out, cudaStream_t s) {
  if (rows == 0) return;
  const bool vec = dim % 4 == 0 && dim > 0 && dim <= 4 * kNormVec * 1024 &&
                   (reinterpret_cast<uintptr_t>(h) | reinterpret_cast<uintptr_t>(y) |
                    reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out)) %
                           16 ==
                       0;
  if (vec) {
    const int threads = int(std::min<int64_t>(1024, (dim / 4 + 31) / 32 * 32));  // ≥ 32: dim ≥ 4
    launch_k(add_rms_norm_vec_kernel, unsigned(rows), threads, 0, s, h, y, dim, w, eps, out);
    return;
  }
  launch_k(add_rms_norm_kernel, unsigned(rows), row_threads(dim), 0, s, h, y, dim, w, eps, out);
}

void launch_gated_rms_norm(const float* o, const float* z, int64_t rows, int64_t dim, const float* w,
                           float eps, float* out, cudaStream_t s) {
  if (rows == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(o) % 16 == 0 && reinterpret_cast<uintptr_t>(z) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (aligned && dim % 4 == 0 && dim <= 512) {
    launch_k(gated_rms_norm_warp_kernel, blocks_for(rows, kNormWarpRowsPerBlock), kNormWarpRowsPerBlock * 32,
             0, s, o, z, rows, dim, w, eps, out);
    return;
  }
  launch_k(gated_rms_norm_kernel, unsigned(rows), row_threads(dim), 0, s, o, z, dim, w, eps, out);
}

void launch_rope(float* x, int64_t tokens, int heads, int head_dim, int rotary_dim, const int64_t* start_pos,
                 const float* inv_freq, cudaStream_t s) {
  const int half = rotary_dim / 2;
  const int64_t n = tokens * heads * half;
  if (n == 0) return;
  launch_k(rope_kernel, blocks_for(n, kThreads), kThreads, 0, s, x, tokens, heads, head_dim, half, start_pos,
           inv_freq);
}

void launch_embed(const int32_t* tokens, int64_t n, const WeightView& table, float* out, cudaStream_t s) {
  if (n == 0) return;
  MOESERVE_DISPATCH_WTYPE(table.type, T,
                          launch_k(embed_kernel<T>, unsigned(n), 256, 0, s, tokens, table, out));
}

void launch_mul_sigmoid(float* x, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride,
                        cudaStream_t s) {
  if (rows * dim == 0) return;
  launch_k(mul_sigmoid_kernel, blocks_for(rows * dim, kThreads), kThreads, 0, s, x, gate, rows, dim,
           gate_stride);
}

void launch_add_sigmoid_gated(float* out, const float* y, const float* gate, int64_t rows, int64_t dim,
                              cudaStream_t s) {
  if (rows * dim == 0) return;
  launch_k(add_sigmoid_gated_kernel, blocks_for(rows * dim, kThreads), kThreads, 0, s, out, y, gate, rows,
           dim);
}

void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_k(silu_mul_kernel, blocks_for(n, kThreads), kThreads, 0, s, gate, up, out, n);
}

void launch_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_k(to_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, s, x, reinterpret_cast<__nv_bfloat16*>(out),
           n);
}

void launch_to_bf16_terms(const float* x, uint16_t* terms, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  auto* t = reinterpret_cast<__nv_bfloat16*>(terms);
  launch_k(to_bf16_terms_kernel, blocks_for(n, kThreads), kThreads, 0, s, x, t, t + n, t + 2 * n, n);
}

void launch_dequant_bf16(const WeightView& w, uint16_t* out, cudaStream_t s) {
  const int64_t n = w.rows * w.cols;
  if (n == 0) return;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  if (w.type == WType::FP8 && w.cols % 16 == 0 && w.block_cols % 16 == 0 && is_pow2(w.block_cols) &&
      reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    launch_k(dequant_fp8_vec_kernel, blocks_for(n / 16, kThreads), kThreads, 0, s, w, o);
    return;
  }
  MOESERVE_DISPATCH_WTYPE(w.type, T,
                          launch_k(dequant_bf16_kernel<T>, blocks_for(n, kThreads), kThreads, 0, s, w, o));
}

void launch_dequant_f32(const WeightView& w, float* out, cudaStream_t s) {
  const int64_t n = w.rows * w.cols;
  if (n == 0) return;
  MOESERVE_DISPATCH_WTYPE(w.type, T,
                          launch_k(dequant_f32_kernel<T>, blocks_for(n, kThreads), kThreads, 0, s, w, out));
}

void launch_argmax(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  launch_k(argmax_kernel, unsigned(rows), 1024, 0, s, x, cols, out);
}

void launch_fill_random(void* data, WType type, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  launch_k(fill_random_kernel, unsigned(std::min<int64_t>(blocks_for(n, kThreads), 65536)), kThreads, 0, s,
           data, type, n, seed, scale);
}

}  // namespace moeserve::cuda
