// Sampling support: each logits row reduced to its normalisers and its k largest values
// (Backend::logits_topk), so that a decode step sends a few KB per sequence to the host instead of the whole
// vocabulary.
//
// Two launches. Stage 1: one block per (row, chunk of 8192 columns) loads its chunk into shared memory, takes
// the chunk's max and Σ exp sums, and selects the chunk's k largest by a radix select over 64-bit keys
// (ordered float bits, then the inverted column, so every key is distinct and larger means "sampled first").
// Stage 2: one block per row combines the chunk sums, radix-selects the k largest of the chunks' candidates
// (read from L2), sorts them (bitonic) and writes the record.
#include "backend/cuda/common.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kChunk = 8192;
constexpr int kChunkThreads = 512;
constexpr int kMergeThreads = 1024;
constexpr int kSortSize = kLogitsTopkMax;  // a power of two
static_assert((kSortSize & (kSortSize - 1)) == 0);

// Backend's LogitsTopkHeader (backend.h is C++20; the kernels compile as C++17).
struct RecordHeader {
  float max;
  int32_t count;
  double sum_exp;
  double sum_exp_t;
};
static_assert(sizeof(RecordHeader) == kLogitsTopkHeaderFloats * sizeof(float));

// Float bits made monotone as unsigned integers (-inf lowest, +inf highest).
__device__ __forceinline__ uint32_t ordered(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ uint64_t make_key(float v, int64_t col) {
  return uint64_t(ordered(v)) << 32 | uint32_t(~uint32_t(col));
}

struct SelectState {
  uint64_t prefix, mask;
  int k;
  int done;
  int count;
};

// Finds the k-th largest of n distinct keys 8 bits at a time (key 0 marks an empty entry and is skipped);
// afterwards a key is among the k largest iff (key & st.mask) >= st.prefix. Every thread of the block calls
// it.
template <typename KeyAt>
__device__ void radix_select(KeyAt key_at, int n, int k, uint32_t* hist, SelectState& st) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) st.prefix = 0, st.mask = 0, st.k = k, st.done = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint64_t prefix = st.prefix, mask = st.mask;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t key = key_at(i);
      if (key != 0 && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l scans digits 255 - 8l down to 248 - 8l: the digits in descending order across the warp.
      const int want = st.k;
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) c[j] = hist[255 - 8 * lane - j], sum += c[j];
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      uint32_t acc = incl - sum;
      if (acc < uint32_t(want) && uint32_t(want) <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (acc + c[j] >= uint32_t(want)) {
            const uint64_t digit = uint64_t(255 - 8 * lane - j);
            st.k = want - int(acc);
            st.prefix = prefix | digit << shift;
            st.mask = mask | uint64_t(0xff) << shift;
            st.done = c[j] == uint32_t(st.k);  // the whole bucket is in: no need to look further
            break;
          }
          acc += c[j];
        }
      }
    }
    __syncthreads();
    if (st.done) break;
  }
}

// Stage 1: grid (chunks, rows). partial: [rows][chunks][k] keys (0 pads); stats: [rows][chunks][3] = chunk
// max, Σ exp(l - max), Σ exp((l - max) / t).
__global__ void __launch_bounds__(kChunkThreads)
    topk_chunk_kernel(const float* __restrict__ x, int64_t cols, const float* __restrict__ temperatures,
                      int k, uint64_t* __restrict__ partial, float* __restrict__ stats) {
  __shared__ float values[kChunk];
  __shared__ uint32_t hist[256];
  __shared__ float scratch[32];
  __shared__ SelectState st;
  pdl_begin();
  const int64_t row = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
  const int64_t begin = chunk * kChunk;
  const int n = int(imin<int64_t>(kChunk, cols - begin));
  const float* src = x + row * cols + begin;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) values[i] = src[i];
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, values[i]);
  m = warp_max(m);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
  __syncthreads();
  m = -INFINITY;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) m = fmaxf(m, scratch[i]);
  const float inv_t = 1.0f / temperatures[row];
  float s1 = 0.0f, st_sum = 0.0f;
  if (m != -INFINITY)
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = values[i] - m;
      s1 += expf(d);
      st_sum += expf(d * inv_t);
    }
  s1 = block_sum(s1, scratch);
  st_sum = block_sum(st_sum, scratch);
  float* out_stats = stats + (row * chunks + chunk) * 3;
  if (threadIdx.x == 0) out_stats[0] = m, out_stats[1] = s1, out_stats[2] = st_sum;

  const int take = n < k ? n : k;
  auto key_at = [&](int i) { return make_key(values[i], begin + i); };
  radix_select(key_at, n, take, hist, st);
  if (threadIdx.x == 0) st.count = 0;
  __syncthreads();
  uint64_t* dst = partial + (row * chunks + chunk) * k;
  const uint64_t prefix = st.prefix, mask = st.mask;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = key_at(i);
    if ((key & mask) >= prefix) dst[atomicAdd(&st.count, 1)] = key;
  }
  for (int i = take + threadIdx.x; i < k; i += blockDim.x) dst[i] = 0;
}

// Stage 2: one block per row; out: the row's record (LogitsTopkHeader, k values, k indices).
__global__ void __launch_bounds__(kMergeThreads)
    topk_merge_kernel(const uint64_t* __restrict__ partial, const float* __restrict__ stats, int chunks,
                      int64_t cols, const float* __restrict__ temperatures, int k, float* __restrict__ out) {
  __shared__ uint64_t sorted[kSortSize];
  __shared__ uint32_t hist[256];
  __shared__ SelectState st;
  pdl_begin();
  const int64_t row = blockIdx.x;
  const uint64_t* keys = partial + row * chunks * k;
  const int n = chunks * k;
  const int take = int(imin<int64_t>(k, cols));
  radix_select([&](int i) { return keys[i]; }, n, take, hist, st);
  for (int i = threadIdx.x; i < kSortSize; i += blockDim.x) sorted[i] = 0;
  if (threadIdx.x == 0) st.count = 0;
  __syncthreads();
  const uint64_t prefix = st.prefix, mask = st.mask;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = keys[i];
    if (key != 0 && (key & mask) >= prefix) sorted[atomicAdd(&st.count, 1)] = key;
  }
  // Bitonic sort, descending.
  for (int size = 2; size <= kSortSize; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const int i = threadIdx.x;
      if (i < kSortSize) {
        const int j = i ^ stride;
        if (j > i) {
          const uint64_t a = sorted[i], b = sorted[j];
          const bool descending = (i & size) == 0;
          if (descending ? a < b : a > b) sorted[i] = b, sorted[j] = a;
        }
      }
    }
  __syncthreads();

  float* rec = out + row * (kLogitsTopkHeaderFloats + 2 * int64_t(k));
  float* values = rec + kLogitsTopkHeaderFloats;
  int32_t* ids = reinterpret_cast<int32_t*>(values + k);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const uint64_t key = i < take ? sorted[i] : 0;
    values[i] = i < take ? from_ordered(uint32_t(key >> 32)) : 0.0f;
    ids[i] = i < take ? int32_t(~uint32_t(key)) : 0;
  }
  if (threadIdx.x == 0) {
    const float* s = stats + row * chunks * 3;
    float m = -INFINITY;
    for (int c = 0; c < chunks; ++c) m = fmaxf(m, s[3 * c]);
    const float inv_t = 1.0f / temperatures[row];
    float s1 = 0.0f, st_sum = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      if (s[3 * c] == -INFINITY) continue;
      const float d = s[3 * c] - m;
      s1 += s[3 * c + 1] * expf(d);
      st_sum += s[3 * c + 2] * expf(d * inv_t);
    }
    RecordHeader h;
    h.max = m;
    h.count = take;
    h.sum_exp = s1;
    h.sum_exp_t = st_sum;
    *reinterpret_cast<RecordHeader*>(rec) = h;
  }
}

}  // namespace

size_t logits_topk_scratch_bytes(int64_t rows, int64_t cols, int k) {
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
  return size_t(rows * chunks) * (size_t(k) * sizeof(uint64_t) + 4 * sizeof(float));
}

void launch_logits_topk(const float* x, int64_t rows, int64_t cols, const float* temperatures, int k,
                        void* scratch, float* out, cudaStream_t s) {
  if (rows == 0) return;
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
  auto* partial = static_cast<uint64_t*>(scratch);
  auto* stats = reinterpret_cast<float*>(partial + rows * chunks * k);
  launch_k(topk_chunk_kernel, dim3(unsigned(chunks), unsigned(rows)), kChunkThreads, 0, s, x, cols,
           temperatures, k, partial, stats);
  launch_k(topk_merge_kernel, unsigned(rows), kMergeThreads, 0, s, static_cast<const uint64_t*>(partial),
           static_cast<const float*>(stats), int(chunks), cols, temperatures, k, out);
}

}  // namespace moeserve::cuda
