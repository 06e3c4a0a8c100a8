// FP8 weights (128-column block scales) against a few activation rows — batched decode — on tensor cores,
// reading the FP8 bytes once (mma_fp8.cuh has the MMA step and the fragment layout):
//
//   y[t][r] = Σ_b scale[r / block_rows][b] · Σ_{k in block b} w[r][k] · x[t][k]
//
// bf16 weights take the same kernels at 3-8 rows (no scales; 256 bytes per row and chunk), where the
// float32 GEMV's loads of x bound it: the MMA reads each x fragment once per 32 rows.
//
// From 9 rows, two launches. The first writes x as bf16 MMA fragments in the order the second reads them
// (one 2 KB run per chunk, token tile and term, 64 bytes per lane): coalesced 16-byte loads of half the bytes
// and no conversion in the main loop. Up to 8 rows the main kernel makes them itself (kInline below). Up to 8
// rows x is split into three bf16 terms (float32 accuracy: the GEMV's tolerance); from 9 rows it is rounded
// to bf16 once, as the cuBLAS path rounds it. The second launch: a warp owns 32 weight rows and walks
// 128-column chunks (one scale block each); the warps of a block share the rows and split the chunks (chunk c
// goes to warp c % splits); their sums are added in warp order through shared memory (deterministic). Each
// chunk's partial sums are scaled once. blockIdx.x is the token group (16 tokens, or all ≤ 8), so the blocks
// running together read the same weight rows and the groups after the first find them in L2. Up to
// kGemvMaxSegments matrices over the same x go in one launch (matmul_n).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kMaxSplits = 8;  // warps per block

struct MmaSegments {
  WeightView w[kGemvMaxSegments];
  float* y[kGemvMaxSegments];
  int first_tile[kGemvMaxSegments + 1];  // row tiles (of 32) before segment i
  int count;
};

// xf[group][chunk][tile][term][lane][16 words]: for lane (g, q), words 8h + p hold term t of
// x[token 16·group + 8·tile + g][128·chunk + 64h + 16q + 2p, +1]; tokens ≥ n are zeros.
template <int kNT, int kTerms>
__global__ void fp8_mma_fragments_kernel(const float* __restrict__ x, int64_t n, int64_t K,
                                         uint4* __restrict__ xf) {
  pdl_begin();
  const int64_t chunks = K / kMmaChunk;
  const int64_t id = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // (group, chunk, tile, lane)
  const int64_t groups = (n + 8 * kNT - 1) / (8 * kNT);
  if (id >= groups * chunks * kNT * 32) return;
  const int lane = int(id & 31), g = lane >> 2, q = lane & 3;
  const int j = int((id >> 5) % kNT);
  const int64_t c = (id >> 5) / kNT % chunks, grp = (id >> 5) / kNT / chunks;
  const int64_t tok = grp * 8 * kNT + 8 * j + g;
  uint32_t f[kTerms][2][8];
  load_x_fragment<kTerms>(x + imin<int64_t>(tok, n - 1) * K, c * kMmaChunk, q, tok < n, f);
  uint4* out = xf + (((grp * chunks + c) * kNT + j) * kTerms) * 32 * 4 + lane * 4;
#pragma unroll
  for (int t = 0; t < kTerms; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 2; ++v)
        out[t * 32 * 4 + 2 * h + v] =
            make_uint4(f[t][h][4 * v], f[t][h][4 * v + 1], f[t][h][4 * v + 2], f[t][h][4 * v + 3]);
}

template <int kNT, int kTerms>
__device__ __forceinline__ void load_fragments(const uint4* __restrict__ src,
                                               uint32_t (&xf)[kNT][kTerms][2][8]) {
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int t = 0; t < kTerms; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = __ldg(src + (j * kTerms + t) * 32 * 4 + i);
        xf[j][t][i >> 1][4 * (i & 1)] = v.x, xf[j][t][i >> 1][4 * (i & 1) + 1] = v.y;
        xf[j][t][i >> 1][4 * (i & 1) + 2] = v.z, xf[j][t][i >> 1][4 * (i & 1) + 3] = v.w;
      }
}

// One chunk at a time in ≤ 128 registers: two blocks of up to 8 warps per multiprocessor, the bytes in flight
// coming from many warps. (Loading the next chunk's weights and fragments ahead took ~220 registers, one
// block per multiprocessor, and was slower: 8192x2048 at 16 rows 18.8 us against 13.3.)
// kInline (up to 8 rows, one token tile): each warp makes its chunk's fragments from float32 x itself
// instead of reading the first launch's; x is a few KB in L2, and the launch saved is a whole kernel's
// latency in a decode step's chain of dependent kernels.
// kMixed: each segment's own dtype (FP8 or bf16) decides, at run time; otherwise T.
template <WType T, int kNT, int kTerms, bool kInline, bool kMixed>
__global__ __launch_bounds__(kMaxSplits * 32, 2) void gemm_mma_kernel(const uint4* __restrict__ xf,
                                                                      const float* __restrict__ x, int64_t n,
                                                                      MmaSegments segs) {
  static_assert(!kInline || kNT == 1, "inline fragments: one token tile");
  int seg = 0;
  while (seg + 1 < segs.count && int(blockIdx.y) >= segs.first_tile[seg + 1]) ++seg;
  WeightView w = segs.w[0];
  float* y = segs.y[0];
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i)
    if (seg == i) w = segs.w[i], y = segs.y[i];
  const bool fp8 = kMixed ? w.type == WType::FP8 : T == WType::FP8;
  const int kBytes = fp8 ? 1 : 2;
  const int splits = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t K = w.cols, row_base = int64_t(int(blockIdx.y) - segs.first_tile[seg]) * kMmaWarpRows;
  const int chunks = int(K / kMmaChunk);
  const uint8_t* wp[4];  // rows g, g+8 (m tile 0), g+16, g+24 (m tile 1), clamped to the matrix
#pragma unroll
  for (int i = 0; i < 4; ++i)
    wp[i] = static_cast<const uint8_t*>(w.data) +
            imin<int64_t>(row_base + g + 8 * i, w.rows - 1) * K * kBytes + 16 * kBytes * q;
  // FP8: the 32 rows share a row block (block_rows % 32 == 0).
  const float* srow = fp8 ? fp8_scale_row(w, row_base) : nullptr;
  if (threadIdx.x == 0 && blockIdx.x == 0) {  // these rows into L2 while the previous kernel runs
    const int64_t rows = imin<int64_t>(kMmaWarpRows, w.rows - row_base);
    prefetch_l2(static_cast<const uint8_t*>(w.data) + row_base * K * kBytes, uint32_t(rows * K * kBytes));
  }
  pdl_begin();
  // This block's token group; a chunk's fragments for it are kNT * kTerms runs of 2 KB.
  const uint4* xg = xf + int64_t(blockIdx.x) * chunks * kNT * kTerms * 32 * 4 + lane * 4;
  const int64_t chunk_stride = int64_t(kNT) * kTerms * 32 * 4;
  float acc[2][kNT][4] = {};
  auto fragments = [&](int c, uint32_t(&xc)[kNT][kTerms][2][8]) {
    if constexpr (kInline)
      load_x_fragment<kTerms>(x + imin<int64_t>(g, n - 1) * K, int64_t(c) * kMmaChunk, q, g < n, xc[0]);
    else
      load_fragments<kNT, kTerms>(xg + c * chunk_stride, xc);
  };
  for (int c = warp; c < chunks; c += splits) {
    uint32_t xc[kNT][kTerms][2][8];
    if (fp8) {
      uint4 wv[4][2];
      load_w_fragment(wp, int64_t(c) * kMmaChunk, wv);
      fragments(c, xc);
      const float sc = __ldg(srow + c);
      float part[2][kNT][4] = {};
      mma_chunk<kNT, kTerms>(wv, xc, part);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][j][e] = fmaf(sc, part[m][j][e], acc[m][j][e]);
    } else {
      uint4 wv[4][2][2];
      load_w_fragment_bf16(wp, int64_t(c) * kMmaChunk * 2, wv);
      fragments(c, xc);
      mma_chunk_bf16<kNT, kTerms>(wv, xc, acc);
    }
  }

  // The warps' sums, added in warp order: red[warp][value][lane].
  constexpr int kVals = 2 * kNT * 4;
  __shared__ float red[kMaxSplits][kVals][32];
  if (splits > 1) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][(m * kNT + j) * 4 + e][lane] = acc[m][j][e];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = red[0][(m * kNT + j) * 4 + e][lane];
          for (int ww = 1; ww < splits; ++ww) s += red[ww][(m * kNT + j) * 4 + e][lane];
          acc[m][j][e] = s;
        }
  }
  const int64_t t0 = int64_t(blockIdx.x) * 8 * kNT;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row_base + 16 * m + g + 8 * (e >> 1), tok = t0 + 8 * j + 2 * q + (e & 1);
        if (row < w.rows && tok < n) y[tok * w.rows + row] = acc[m][j][e];
      }
}

template <WType T, int kNT, int kTerms, bool kMixed = false>
void launch_tiles(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count, void* scratch,
                  cudaStream_t s) {
  const int64_t K = ws[0].cols, chunks = K / kMmaChunk, groups = (n + 8 * kNT - 1) / (8 * kNT);
  auto* xf = static_cast<uint4*>(scratch);
  // MOESERVE_CUDA_MMA_INLINE_X=0 keeps the fragments' own launch at ≤ 8 rows too, for measuring.
  static const bool inline_enabled = [] {
    const char* e = std::getenv("MOESERVE_CUDA_MMA_INLINE_X");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  constexpr bool kCanInline = kNT == 1;
  const bool inline_x = kCanInline && inline_enabled;
  const int64_t threads = groups * chunks * kNT * 32;
  if (!inline_x)
    launch_k(fp8_mma_fragments_kernel<kNT, kTerms>, blocks_for(threads, 256), 256, 0, s, x, n, K, xf);
  MmaSegments segs{};
  segs.count = count;
  int tiles = 0;
  for (int i = 0; i < count; ++i) {
    segs.w[i] = ws[i], segs.y[i] = ys[i], segs.first_tile[i] = tiles;
    tiles += int((ws[i].rows + kMmaWarpRows - 1) / kMmaWarpRows);
  }
  segs.first_tile[count] = tiles;
  // Split the chunks over enough warps for 16 per multiprocessor (132 on the H200) in all.
  const int64_t want = (132 * 2 * kMaxSplits + tiles * groups - 1) / (tiles * groups);
  const int splits = int(std::max<int64_t>(1, imin<int64_t>(imin<int64_t>(want, kMaxSplits), chunks)));
  const dim3 grid{unsigned(groups), unsigned(tiles)}, block{unsigned(32 * splits)};
  if constexpr (kCanInline) {
    if (inline_x) {
      launch_k(gemm_mma_kernel<T, kNT, kTerms, true, kMixed>, grid, block, 0, s,
               static_cast<const uint4*>(xf), x, n, segs);
      return;
    }
  }
  launch_k(gemm_mma_kernel<T, kNT, kTerms, false, kMixed>, grid, block, 0, s, static_cast<const uint4*>(xf),
           x, n, segs);
}

}  // namespace

bool gemm_mma_supported(const WeightView& w) {
  const bool layout = w.cols % kMmaChunk == 0 && w.cols > 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if (w.type == WType::BF16) return layout;
  return layout && w.type == WType::FP8 && w.block_cols == kMmaChunk && w.block_rows > 0 &&
         w.block_rows % kMmaWarpRows == 0 && w.scale_inv != nullptr;
}

size_t gemm_mma_scratch_bytes(int64_t n, int64_t cols) {
  // Up to 8 rows: one tile of three terms; else 16-token groups of one term. 2 bytes per term and value.
  return n <= 8 ? size_t(8 * cols * 3 * 2) : size_t((n + 15) / 16 * 16 * cols * 2);
}

void launch_gemm_mma(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                     void* scratch, cudaStream_t s) {
  if (n == 0 || count == 0) return;
  bool mixed = false;
  for (int i = 1; i < count; ++i) mixed = mixed || ws[i].type != ws[0].type;
  if (mixed) {  // FP8 and bf16 matrices, ≤ 8 rows (matmul_n)
    launch_tiles<WType::FP8, 1, 3, true>(x, n, ws, ys, count, scratch, s);
  } else if (ws[0].type == WType::BF16) {  // the backend sends ≤ 8 rows (more run as token groups of 8)
    launch_tiles<WType::BF16, 1, 3>(x, n, ws, ys, count, scratch, s);
  } else if (n <= 8) {
    launch_tiles<WType::FP8, 1, 3>(x, n, ws, ys, count, scratch, s);
  } else {
    launch_tiles<WType::FP8, 2, 1>(x, n, ws, ys, count, scratch, s);
  }
}

}  // namespace moeserve::cuda
