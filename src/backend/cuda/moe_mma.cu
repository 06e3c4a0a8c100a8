// The experts of a large batch (prefill, decode batches of ≥ 128 tokens) as one grouped GEMM on tensor cores:
// every work item of the MoE plan (an expert and ≤ 64 consecutive rows of the grouped activations) is a
// 64-row M tile; each block multiplies one item's rows by a 128-row slab of that expert's weights.
//
//   gate/up: h[rows][n0..n0+63]   = silu(A · gate[n0..n0+63]ᵀ) * (A · up[n0..n0+63]ᵀ)  (bf16 out)
//   down:    y[rows][n0..n0+127]  = h · down[n0..n0+127]ᵀ                              (float32 out)
//
// mma.sync m16n8k16 bf16 with float32 accumulation; operands staged through shared memory by cp.async in a
// three-stage pipeline (64-column K tiles) and read with ldmatrix. FP8 weights travel as FP8 (half the
// bytes of bf16 through the pipeline) and are widened with their block scale to bf16 in shared memory once
// per K tile, as the reference widens them. The previous WMMA kernel loaded its tiles synchronously through
// registers and ran at 9-13% of cuBLAS; this one keeps two tiles in flight while the third is multiplied.
// FP8 weights in 128x128 blocks take the FP8 x FP8 kernels below instead (activations quantized per 1x128):
// mma.sync m16n8k32 e4m3, or on a compute capability 9.0 device (H100/H200) wgmma m64n128k32 (wgmma.cuh).
#include <cuda_bf16.h>

#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_fp8.cuh"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kBM = kMoeMmaTile;     // rows of a work item
constexpr int kBN = 128;             // weight rows per block (gate/up: 64 gate + the 64 up rows beside them)
constexpr int kBK = 64;              // columns per pipeline stage
constexpr int kStages = 4;           // two blocks of 4 stages fit an SM's shared memory
constexpr int kThreads = 128;        // 4 warps: 2 (M) x 2 (N), 32 x 64 each
constexpr int kPitch = kBK + 8;      // bf16 per shared row: 144 bytes, so ldmatrix's 8 rows hit 8 bank groups
constexpr int kRawPitch = kBK + 16;  // FP8 bytes per shared row of a raw weight tile

constexpr int kATileBytes = kBM * kPitch * 2;
constexpr int kBTileBytes = kBN * kPitch * 2;
constexpr int kRawTileBytes = kBN * kRawPitch;

template <WType T>
constexpr int smem_bytes() {
  // bf16: A and B tiles per stage. FP8: A tiles and raw FP8 B tiles per stage, plus one widened B tile.
  return T == WType::FP8 ? kStages * (kATileBytes + kRawTileBytes) + kBTileBytes
                         : kStages * (kATileBytes + kBTileBytes);
}

// The block's slab of weight rows in shared-memory order. Down: rows n0..n0+127 of the down matrix. Gate/up:
// warp wn (mma_tile's N half) reads shared rows [64wn, 64wn + 64) = gate rows n0 + 32wn + (0..31) then the up
// rows of the same indices, so a thread ends with gate and up of the same output columns.
struct Slab {
  const uint8_t* base[2];  // gate and up (both the down matrix for down)
  const float* scale[2];
  int64_t n0;
  bool gate_up;
  int64_t rows, cols;  // of each matrix
  int scale_cols;

  __device__ int half(int r) const { return gate_up ? (r >> 5) & 1 : 0; }
  __device__ int64_t row(int r) const { return n0 + (gate_up ? ((r >> 6) << 5) + (r & 31) : r); }
};

template <bool kGateUp>
__device__ Slab make_slab(const ExpertTable& t, int e, int64_t n0) {
  Slab s;
  s.n0 = n0, s.gate_up = kGateUp;
  if constexpr (kGateUp) {
    s.base[0] = static_cast<const uint8_t*>(t.gate[e]), s.base[1] = static_cast<const uint8_t*>(t.up[e]);
    s.scale[0] = t.gate_scale ? t.gate_scale[e] : nullptr, s.scale[1] = t.up_scale ? t.up_scale[e] : nullptr;
    s.rows = t.inter, s.cols = t.hidden;
  } else {
    s.base[0] = s.base[1] = static_cast<const uint8_t*>(t.down[e]);
    s.scale[0] = s.scale[1] = t.down_scale ? t.down_scale[e] : nullptr;
    s.rows = t.hidden, s.cols = t.inter;
  }
  s.scale_cols = t.block_cols ? int((s.cols + t.block_cols - 1) / t.block_cols) : 0;
  return s;
}

// Issues the cp.async copies of K tile k0 into one stage: the item's A rows and the slab's weight rows
// (rows past the item or the matrix are zero-filled).
template <WType T>
__device__ __forceinline__ void load_stage(const __nv_bfloat16* __restrict__ A, int64_t K, int first,
                                           int count, const Slab& s, int64_t k0, __nv_bfloat16* As,
                                           void* Bs) {
  constexpr int kChunksA = kBM * kBK / 8;  // 16-byte chunks of bf16
#pragma unroll
  for (int c = threadIdx.x; c < kChunksA; c += kThreads) {
    const int r = c / (kBK / 8), col = (c % (kBK / 8)) * 8;
    const bool live = r < count;
    cp_async16(As + r * kPitch + col, A + (int64_t(first) + (live ? r : 0)) * K + k0 + col, live);
  }
  constexpr int kBytes = T == WType::FP8 ? 1 : 2;
  constexpr int kPerRow = kBK * kBytes / 16;
#pragma unroll
  for (int c = threadIdx.x; c < kBN * kPerRow; c += kThreads) {
    const int r = c / kPerRow, off = (c % kPerRow) * 16;
    const int64_t row = s.row(r);
    const bool live = row < s.rows;
    const uint8_t* src =
        (s.half(r) ? s.base[1] : s.base[0]) + ((live ? row : 0) * s.cols + k0) * kBytes + off;
    uint8_t* dst = static_cast<uint8_t*>(Bs) + (T == WType::FP8 ? r * kRawPitch : r * kPitch * 2) + off;
    cp_async16(dst, src, live);
  }
}

// FP8 only: the raw tile widened to bf16 with each row's block scale for columns [k0, k0 + kBK).
__device__ __forceinline__ void widen_stage(const Slab& s, int block_rows, int block_cols, int64_t k0,
                                            const uint8_t* raw, __nv_bfloat16* Bw) {
  constexpr int kPerRow = kBK / 16;
#pragma unroll
  for (int c = threadIdx.x; c < kBN * kPerRow; c += kThreads) {
    const int r = c / kPerRow, off = (c % kPerRow) * 16;
    const int64_t row = s.row(r);
    const uint4 v = *reinterpret_cast<const uint4*>(raw + r * kRawPitch + off);
    float sc = 0.0f;
    if (row < s.rows)
      sc = (s.half(r) ? s.scale[1] : s.scale[0])[(row / block_rows) * s.scale_cols + (k0 + off) / block_cols];
    uint32_t w[8];
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const float2 f = fp8x2_to_float2(fp8_pair(v, p));
      w[p] = bf16x2_bits(f.x * sc, f.y * sc);
    }
    uint4* dst = reinterpret_cast<uint4*>(Bw + r * kPitch + off);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// acc[m][j] += the warp's 32 A rows (two m16 tiles) · its 64 B rows (eight n8 tiles) over one K tile. Each
// k16 step loads all its fragments before its 16 MMAs, so the loads' latency is paid once per step.
__device__ __forceinline__ void mma_tile(const __nv_bfloat16* As, const __nv_bfloat16* Bs, int wm, int wn,
                                         float (&acc)[2][8][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    uint32_t a[2][4], b[4][4];  // b[jp]: n8 tiles 2jp and 2jp+1, k halves 0 and 1 each
#pragma unroll
    for (int m = 0; m < 2; ++m)
      ldmatrix_x4(a[m], As + (wm * 32 + m * 16 + (lane & 15)) * kPitch + kk + (lane >> 4) * 8);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp)
      ldmatrix_x4(b[jp], Bs + (wn * 64 + jp * 16 + (lane & 7) + (lane >> 4) * 8) * kPitch + kk +
                             ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        mma_bf16(acc[m][2 * jp], a[m][0], a[m][1], a[m][2], a[m][3], b[jp][0], b[jp][1]);
        mma_bf16(acc[m][2 * jp + 1], a[m][0], a[m][1], a[m][2], a[m][3], b[jp][2], b[jp][3]);
      }
  }
}

// Writes a block's accumulators: gate/up as bf16 silu(gate) * up, down as float32.
// Accumulator element c of (m, j): row 16m + g + 8(c/2) of the warp's 32, column 8j + 2q + (c%2).
template <bool kGateUp>
__device__ __forceinline__ void store_tile(const float (&acc)[2][8][4], int first, int count, int64_t n0,
                                           int64_t N, int wm, int wn, void* __restrict__ out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = wm * 32 + m * 16 + g + 8 * hr;
      if (r >= count) continue;
      const int64_t row = first + r;
      if constexpr (kGateUp) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t col = n0 + wn * 32 + 8 * j + 2 * q;
          if (col >= N) continue;
          const float* gt = acc[m][j] + 2 * hr;
          const float* up = acc[m][j + 4] + 2 * hr;
          *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(out) + row * N + col) =
              bf16x2_bits(siluf_(gt[0]) * up[0], siluf_(gt[1]) * up[1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t col = n0 + wn * 64 + 8 * j + 2 * q;
          if (col >= N) continue;
          *reinterpret_cast<float2*>(static_cast<float*>(out) + row * N + col) =
              make_float2(acc[m][j][2 * hr], acc[m][j][2 * hr + 1]);
        }
      }
    }
}

template <WType T, bool kGateUp>
__global__ __launch_bounds__(kThreads) void moe_grouped_mma(ExpertTable t,
                                                            const __nv_bfloat16* __restrict__ A,
                                                            const int32_t* __restrict__ items,
                                                            const int32_t* __restrict__ num_items,
                                                            void* __restrict__ out) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int64_t K = kGateUp ? t.hidden : t.inter;
  const int64_t n0 = int64_t(blockIdx.x) * (kGateUp ? kBN / 2 : kBN);
  const Slab s = make_slab<kGateUp>(t, e, n0);

  auto a_tile = [&](int st) { return reinterpret_cast<__nv_bfloat16*>(smem + st * kATileBytes); };
  uint8_t* b_base = smem + kStages * kATileBytes;
  auto b_stage = [&](int st) -> void* {
    return b_base + st * (T == WType::FP8 ? kRawTileBytes : kBTileBytes);
  };
  __nv_bfloat16* widened = reinterpret_cast<__nv_bfloat16*>(b_base + kStages * kRawTileBytes);

  const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
  float acc[2][8][4] = {};
  const int tiles = int(K / kBK);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < tiles) load_stage<T>(A, K, first, count, s, int64_t(st) * kBK, a_tile(st), b_stage(st));
    cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt is in; every warp is done with the stage the next load overwrites
    const int st = kt % kStages;
    const __nv_bfloat16* Bt;
    if constexpr (T == WType::FP8) {
      widen_stage(s, t.block_rows, t.block_cols, int64_t(kt) * kBK, static_cast<const uint8_t*>(b_stage(st)),
                  widened);
      __syncthreads();
      Bt = widened;
    } else {
      Bt = static_cast<const __nv_bfloat16*>(b_stage(st));
    }
    const int next = kt + kStages - 1;
    if (next < tiles)
      load_stage<T>(A, K, first, count, s, int64_t(next) * kBK, a_tile(next % kStages),
                    b_stage(next % kStages));
    cp_async_commit();
    mma_tile(a_tile(st), Bt, wm, wn, acc);
  }

  store_tile<kGateUp>(acc, first, count, n0, kGateUp ? t.inter : t.hidden, wm, wn, out);
}

// ---- FP8 x FP8 ------------------------------------------------------------------------------------------
// With 128x128 weight blocks the activations are quantized too (e4m3, one scale per row and 128 columns, as
// the dense FP8 prefill path and DeepGEMM do), so the MMA is mma.sync m16n8k32 e4m3 (twice bf16's rate)
// and no tile is widened. A pipeline stage is one 128-column scale block: its products are summed in `part`
// and added to the accumulators times the row's activation scale and the slab's weight scale.
constexpr int kQBK = kFp8QuantBlock;    // columns (bytes) per stage = the scale block
constexpr int kQPitch = kQBK + 16;      // 144 bytes: ldmatrix's 8 rows hit 8 bank groups
constexpr int kQATile = kBM * kQPitch;  // bytes
constexpr int kQBTile = kBN * kQPitch;
constexpr int kQSmem = kStages * (kQATile + kQBTile);

__device__ __forceinline__ void load_stage_q(const uint8_t* __restrict__ A, int64_t K, int first, int count,
                                             const Slab& s, int64_t k0, uint8_t* As, uint8_t* Bs) {
  constexpr int kPerRow = kQBK / 16;
#pragma unroll
  for (int c = threadIdx.x; c < kBM * kPerRow; c += kThreads) {
    const int r = c / kPerRow, off = (c % kPerRow) * 16;
    const bool live = r < count;
    cp_async16(As + r * kQPitch + off, A + (int64_t(first) + (live ? r : 0)) * K + k0 + off, live);
  }
#pragma unroll
  for (int c = threadIdx.x; c < kBN * kPerRow; c += kThreads) {
    const int r = c / kPerRow, off = (c % kPerRow) * 16;
    const int64_t row = s.row(r);
    const bool live = row < s.rows;
    const uint8_t* src = (s.half(r) ? s.base[1] : s.base[0]) + (live ? row : 0) * s.cols + k0 + off;
    cp_async16(Bs + r * kQPitch + off, src, live);
  }
}

template <bool kGateUp>
__global__ __launch_bounds__(kThreads) void moe_grouped_mma_fp8(ExpertTable t, const uint8_t* __restrict__ A,
                                                                const float* __restrict__ a_scales,
                                                                const int32_t* __restrict__ items,
                                                                const int32_t* __restrict__ num_items,
                                                                void* __restrict__ out) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int64_t K = kGateUp ? t.hidden : t.inter, kblocks = K / kQBK;
  const int64_t n0 = int64_t(blockIdx.x) * (kGateUp ? kBN / 2 : kBN);
  const Slab s = make_slab<kGateUp>(t, e, n0);
  // Each half of the slab lies in one 128-row scale block: its scale row.
  const float* sb0 = s.scale[0] + (n0 / kQBK) * s.scale_cols;
  const float* sb1 = s.scale[1] + ((kGateUp ? n0 : n0 + kBN / 2) / kQBK) * s.scale_cols;

  auto a_tile = [&](int st) { return smem + st * kQATile; };
  auto b_tile = [&](int st) { return smem + kStages * kQATile + st * kQBTile; };
  const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
  const int lane = threadIdx.x & 31, g = lane >> 2;
  // This thread's four accumulator rows (m tile, half): their activation-scale rows (clamped past the item).
  int sa[2][2];  // offsets from a_scales (int: the scratch holds far fewer than 2^31 scales)
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      sa[m][hr] = (first + imin(wm * 32 + m * 16 + g + 8 * hr, count - 1)) * int(kblocks);

  float acc[2][8][4] = {};
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < kblocks) load_stage_q(A, K, first, count, s, int64_t(st) * kQBK, a_tile(st), b_tile(st));
    cp_async_commit();
  }
  for (int kt = 0; kt < kblocks; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int st = kt % kStages;
    const int next = kt + kStages - 1;
    if (next < kblocks)
      load_stage_q(A, K, first, count, s, int64_t(next) * kQBK, a_tile(next % kStages),
                   b_tile(next % kStages));
    cp_async_commit();

    const uint8_t* As = a_tile(st);
    const uint8_t* Bs = b_tile(st);
    const float w_lo = __ldg(sb0 + kt), w_hi = __ldg(sb1 + kt);
    float sx[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) sx[m][hr] = __ldg(a_scales + sa[m][hr] + kt);
        // Half the warp's n8 tiles at a time, so the block's partial sums take 32 registers, not 64.
#pragma unroll
    for (int jh = 0; jh < 2; ++jh) {
      float part[2][4][4] = {};
#pragma unroll
      for (int kk = 0; kk < kQBK; kk += 32) {
        uint32_t a[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m)
          ldmatrix_x4(a[m], As + (wm * 32 + m * 16 + (lane & 15)) * kQPitch + kk + (lane >> 4) * 16);
        uint32_t b[2][4];
#pragma unroll
        for (int jp = 0; jp < 2; ++jp)
          ldmatrix_x4(b[jp], Bs + (wn * 64 + (2 * jh + jp) * 16 + (lane & 7) + (lane >> 4) * 8) * kQPitch +
                                 kk + ((lane >> 3) & 1) * 16);
#pragma unroll
        for (int jp = 0; jp < 2; ++jp)
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma_e4m3(part[m][2 * jp], a[m][0], a[m][1], a[m][2], a[m][3], b[jp][0], b[jp][1]);
            mma_e4m3(part[m][2 * jp + 1], a[m][0], a[m][1], a[m][2], a[m][3], b[jp][2], b[jp][3]);
          }
      }
      // Gate/up: n8 tiles 0..3 are gate rows, 4..7 up rows; down: warp half wn's tiles lie in slab half wn.
      const float w = kGateUp ? (jh ? w_hi : w_lo) : (wn ? w_hi : w_lo);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            acc[m][4 * jh + j][c] = fmaf(part[m][j][c], sx[m][c / 2] * w, acc[m][4 * jh + j][c]);
    }
  }
  store_tile<kGateUp>(acc, first, count, n0, kGateUp ? t.inter : t.hidden, wm, wn, out);
}

// ---- FP8 x FP8 on Hopper's warpgroup MMA ----------------------------------------------------------------
// The same items, activations and scales as moe_grouped_mma_fp8, one warpgroup per block: the item's 64 rows
// times a 128-row slab (gate/up: gate rows n0..n0+63, then the up rows of the same indices; down: rows
// n0..n0+127) by wgmma m64n128k32, both operands read from shared memory (stored in the 128-byte swizzle by
// cp.async, four stages of one 128-column scale block each). A stage's four MMAs land in `part`, which is
// added to the accumulators times the row's activation scale and the slab half's weight scale. The mma.sync
// kernel above spends as many issue slots on fragment loads and these FMAs as on its MMAs (ncu: instruction
// bound at ~148 TFLOP/s); here the tensor cores fetch their operands themselves.
constexpr int kWgStages = 4;
constexpr int kWgATile = kBM * kQBK;  // bytes: 64 rows of 128
constexpr int kWgBTile = kBN * kQBK;  // 128 rows of 128
constexpr int kWgStage = kWgATile + kWgBTile;
constexpr int kWgSmem = kWgStages * kWgStage + 1024;  // + room to align the tiles to 1024 bytes

template <bool kGateUp>
__global__ __launch_bounds__(128, 2) void moe_grouped_wgmma_fp8(ExpertTable t, const uint8_t* __restrict__ A,
                                                                const float* __restrict__ a_scales,
                                                                const int32_t* __restrict__ items,
                                                                const int32_t* __restrict__ num_items,
                                                                void* __restrict__ out) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem_wg[];
  uint8_t* smem = smem_wg + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_wg)) & 1023)) & 1023);
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int64_t K = kGateUp ? t.hidden : t.inter, kblocks = K / kQBK;
  const int64_t N = kGateUp ? t.inter : t.hidden;
  const int64_t n0 = int64_t(blockIdx.x) * (kGateUp ? kBN / 2 : kBN);
  const uint8_t* w0 = static_cast<const uint8_t*>(kGateUp ? t.gate[e] : t.down[e]);
  const uint8_t* w1 = kGateUp ? static_cast<const uint8_t*>(t.up[e]) : w0;
  // Both halves of the slab lie in the 128-row scale block of n0 (n0 is a multiple of 64, or of 128 for down).
  const int scale_cols = int(kblocks);
  const float* sb0 = (kGateUp ? t.gate_scale[e] : t.down_scale[e]) + (n0 / kQBK) * scale_cols;
  const float* sb1 = kGateUp ? t.up_scale[e] + (n0 / kQBK) * scale_cols : sb0;

  auto load = [&](int64_t kt, int st) {
    uint8_t* As = smem + st * kWgStage;
    uint8_t* Bs = As + kWgATile;
    const int64_t k0 = kt * kQBK;
#pragma unroll
    for (int c = threadIdx.x; c < kBM * 8; c += 128) {
      const int r = c >> 3, ch = c & 7;
      const bool live = r < count;
      cp_async16(As + sw128_offset(r, ch), A + (int64_t(first) + (live ? r : 0)) * K + k0 + ch * 16, live);
    }
#pragma unroll
    for (int c = threadIdx.x; c < kBN * 8; c += 128) {
      const int r = c >> 3, ch = c & 7;
      const int half = kGateUp ? r >> 6 : 0;
      const int64_t row = n0 + (kGateUp ? (r & 63) : r);
      const bool live = row < N;
      cp_async16(Bs + sw128_offset(r, ch), (half ? w1 : w0) + (live ? row : 0) * K + k0 + ch * 16, live);
    }
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This thread's two accumulator rows and their activation-scale rows (clamped past the item).
  const int r_lo = warp * 16 + (lane >> 2), r_hi = r_lo + 8;
  const float* sa_lo = a_scales + int64_t(first + imin(r_lo, count - 1)) * kblocks;
  const float* sa_hi = a_scales + int64_t(first + imin(r_hi, count - 1)) * kblocks;

  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f, part[i] = 0.0f;
#pragma unroll
  for (int st = 0; st < kWgStages - 1; ++st) {
    if (st < kblocks) load(st, st);
    cp_async_commit();
  }
  // acc += p times the scales of stage kt. Gate/up: n8 tiles 0..7 are gate columns, 8..15 the up columns of
  // the same outputs.
  auto promote = [&](const float(&p)[64], int64_t kt) {
    const float w_lo = __ldg(sb0 + kt), w_hi = __ldg(sb1 + kt);
    const float x_lo = __ldg(sa_lo + kt), x_hi = __ldg(sa_hi + kt);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float w = kGateUp && j >= 8 ? w_hi : w_lo;
      const float s_lo = x_lo * w, s_hi = x_hi * w;
      acc[4 * j] = fmaf(p[4 * j], s_lo, acc[4 * j]);
      acc[4 * j + 1] = fmaf(p[4 * j + 1], s_lo, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(p[4 * j + 2], s_hi, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(p[4 * j + 3], s_hi, acc[4 * j + 3]);
    }
  };
  auto mma_stage = [&](float(&p)[64], int64_t kt) {
    const uint8_t* As = smem + int(kt % kWgStages) * kWgStage;
    const uint64_t da = sw128_desc(As), db = sw128_desc(As + kWgATile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQBK / 32; ++kk) wgmma_m64n128k32_e4m3(p, da + 2 * kk, db + 2 * kk, kk > 0);
    wgmma_commit();
  };
  // Promoting stage kt - 1 while stage kt's MMAs run (two part arrays, 234 registers) measured no faster.
  for (int64_t kt = 0; kt < kblocks; ++kt) {
    cp_async_wait<kWgStages - 2>();
    fence_proxy_async_shared();
    __syncthreads();  // stage kt is in shared memory; every MMA of stage kt - 1 is done (waited for below)
    const int64_t next = kt + kWgStages - 1;
    if (next < kblocks) load(next, int(next % kWgStages));
    cp_async_commit();
    mma_stage(part, kt);
    wgmma_wait<0>(part);
    promote(part, kt);
  }

  // Gate/up: bf16 silu(gate) * up into h [rows][inter]; down: float32 into y [rows][hidden].
  const int q = lane & 3;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = hr ? r_hi : r_lo;
    if (r >= count) continue;
    const int64_t row = first + r;
    if constexpr (kGateUp) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t col = n0 + 8 * j + 2 * q;
        if (col >= N) continue;
        const float* g = acc + 4 * j + 2 * hr;
        const float* u = acc + 4 * (j + 8) + 2 * hr;
        *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(out) + row * N + col) =
            bf16x2_bits(siluf_(g[0]) * u[0], siluf_(g[1]) * u[1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t col = n0 + 8 * j + 2 * q;
        if (col >= N) continue;
        *reinterpret_cast<float2*>(static_cast<float*>(out) + row * N + col) =
            make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);
      }
    }
  }
}


// q[row] = in[row] in e4m3 per 128 columns (fp8_quant.cuh), scales [rows][cols / 128].
// kGather: in is float32 x and row r is token sorted[r] / top_k's (the gate/up input); else in is bf16 h.
template <bool kGather>
__global__ void moe_quantize_rows(const void* __restrict__ in, int64_t rows, int64_t cols, int top_k,
                                  const int32_t* __restrict__ sorted, uint8_t* __restrict__ q,
                                  float* __restrict__ scales) {
  pdl_begin();
  const int64_t blocks = cols / kQBK;
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (w >= rows * blocks) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = w / blocks, b = w % blocks, col = b * kQBK + 4 * lane;
  float v[4];
  if constexpr (kGather) {
    const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(in) +
                                                      int64_t(sorted[r] / top_k) * cols + col);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 h = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(in) + r * cols + col);
    v[0] = bf16_lo_f(h.x), v[1] = bf16_hi_f(h.x), v[2] = bf16_lo_f(h.y), v[3] = bf16_hi_f(h.y);
  }
  const float scale = quantize_e4m3_x4(v, q + r * cols + col);
  if (lane == 0) scales[r * blocks + b] = scale;
}

template <bool kGateUp>
void launch_grouped_fp8(const ExpertTable& t, const uint8_t* A, const float* a_scales, const MoeScratch& s,
                        int64_t max_items, void* out, cudaStream_t stream) {
  static const bool configured = [] {
    cudaFuncSetAttribute(moe_grouped_mma_fp8<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSmem);
    return true;
  }();
  (void)configured;
  const int64_t N = kGateUp ? t.inter : t.hidden;
  const int per_block = kGateUp ? kBN / 2 : kBN;
  const dim3 grid(unsigned((N + per_block - 1) / per_block), unsigned(max_items));
  if (wgmma_available()) {
    static const bool wg_configured = [] {
      cudaFuncSetAttribute(moe_grouped_wgmma_fp8<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kWgSmem);
      return true;
    }();
    (void)wg_configured;
    launch_k(moe_grouped_wgmma_fp8<kGateUp>, grid, 128, size_t(kWgSmem), stream, t, A, a_scales, s.items,
             s.num_items, out);
    return;
  }
  launch_k(moe_grouped_mma_fp8<kGateUp>, grid, kThreads, size_t(kQSmem), stream, t, A, a_scales, s.items,
           s.num_items, out);
}

template <WType T, bool kGateUp>
void launch_grouped(const ExpertTable& t, const __nv_bfloat16* A, const MoeScratch& s, int64_t max_items,
                    void* out, cudaStream_t stream) {
  static const bool configured = [] {
    cudaFuncSetAttribute(moe_grouped_mma<T, kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         smem_bytes<T>());
    return true;
  }();
  (void)configured;
  const int64_t N = kGateUp ? t.inter : t.hidden;
  const int per_block = kGateUp ? kBN / 2 : kBN;
  const dim3 grid(unsigned((N + per_block - 1) / per_block), unsigned(max_items));
  launch_k(moe_grouped_mma<T, kGateUp>, grid, kThreads, size_t(smem_bytes<T>()), stream, t, A, s.items,
           s.num_items, out);
}

// xb[row] = bf16(x[token of sorted pair row]), eight columns per thread.
__global__ void moe_gather_bf16x8(const float* __restrict__ x, int64_t P, int64_t H, int top_k,
                                  const int32_t* __restrict__ sorted, __nv_bfloat16* __restrict__ xb) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, per_row = H / 8;
  if (i >= P * per_row) return;
  const int64_t row = i / per_row, c = (i % per_row) * 8;
  const float4* src = reinterpret_cast<const float4*>(x + int64_t(sorted[row] / top_k) * H + c);
  const float4 a = src[0], b = src[1];
  *reinterpret_cast<uint4*>(xb + row * H + c) =
      make_uint4(bf16x2_bits(a.x, a.y), bf16x2_bits(a.z, a.w), bf16x2_bits(b.x, b.y), bf16x2_bits(b.z, b.w));
}

// Two columns per thread: h[p][c, c+1] = silu(gate) * up of the bf16 row [gate | up] (inter even).
__global__ void moe_silu_mul_bf16x2(const uint32_t* __restrict__ gu, int64_t P, int64_t inter,
                                    uint32_t* __restrict__ h) {
  pdl_begin();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, half = inter / 2;
  if (i >= P * half) return;
  const int64_t p = i / half, c = i % half;
  const uint32_t g = gu[p * inter + c], u = gu[p * inter + half + c];
  h[i] = bf16x2_bits(siluf_(bf16_lo_f(g)) * bf16_lo_f(u), siluf_(bf16_hi_f(g)) * bf16_hi_f(u));
}

}  // namespace

// wgmma runs on compute capability 9.0 (the binary holds sm_90a code for it: CMakeLists.txt's default
// architectures); MOESERVE_CUDA_MOE_WGMMA=0 keeps the mma.sync kernel there too, for measuring.
bool wgmma_available() {
  static const bool on = [] {
    const char* env = std::getenv("MOESERVE_CUDA_MOE_WGMMA");
    if (env && std::strcmp(env, "0") == 0) return false;
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
  }();
  return on;
}

void launch_moe_gather_bf16(const float* x, int64_t P, int64_t H, int top_k, const int32_t* sorted,
                            uint16_t* xb, cudaStream_t stream) {
  launch_k(moe_gather_bf16x8, blocks_for(P * H / 8, 256), 256, 0, stream, x, P, H, top_k, sorted,
           reinterpret_cast<__nv_bfloat16*>(xb));
}

void launch_moe_silu_mul_bf16(const uint16_t* gu, int64_t pairs, int64_t inter, uint16_t* h,
                              cudaStream_t stream) {
  launch_k(moe_silu_mul_bf16x2, blocks_for(pairs * inter / 2, 256), 256, 0, stream,
           reinterpret_cast<const uint32_t*>(gu), pairs, inter, reinterpret_cast<uint32_t*>(h));
}

bool moe_fp8_activations(const ExpertTable& t) {
  // 128x128 blocks, whole blocks along K, and room for the quantized h where the gathered x was.
  return t.type == WType::FP8 && t.block_rows == kQBK && t.block_cols == kQBK && t.hidden % kQBK == 0 &&
         t.inter % kQBK == 0 && t.inter <= t.hidden;
}

void launch_moe_quantize_rows(const void* in, bool gather, int64_t rows, int64_t cols, int top_k,
                              const int32_t* sorted, uint8_t* q, float* scales, cudaStream_t stream) {
  const unsigned blocks = blocks_for(rows * (cols / kQBK) * 32, 256);
  if (gather)
    launch_k(moe_quantize_rows<true>, blocks, 256, 0, stream, in, rows, cols, top_k, sorted, q, scales);
  else
    launch_k(moe_quantize_rows<false>, blocks, 256, 0, stream, in, rows, cols, top_k, sorted, q, scales);
}

bool moe_mma_supported(const ExpertTable& t) {
  if (t.type != WType::BF16 && t.type != WType::FP8) return false;
  // Whole K tiles, and FP8 scale blocks no narrower than a 16-byte vector.
  if (t.type == WType::FP8 && (t.block_cols % 16 != 0 || t.block_rows <= 0)) return false;
  return t.hidden % kBK == 0 && t.inter % kBK == 0;
}

void launch_moe_grouped_mma(const ExpertTable& t, const float* x, int64_t n, int top_k, int64_t max_items,
                            const MoeScratch& s, cudaStream_t stream) {
  const int64_t P = n * top_k;
  auto* h = static_cast<__nv_bfloat16*>(s.h);
  if (moe_fp8_activations(t)) {
    auto* q = reinterpret_cast<uint8_t*>(s.xb);
    launch_moe_quantize_rows(x, true, P, t.hidden, top_k, s.sorted, q, moe_fp8_row_scales(s.xb, P, t.hidden),
                             stream);
    launch_grouped_fp8<true>(t, q, moe_fp8_row_scales(s.xb, P, t.hidden), s, max_items, h, stream);
    launch_moe_quantize_rows(h, false, P, t.inter, top_k, s.sorted, q, moe_fp8_row_scales(s.xb, P, t.inter),
                             stream);
    launch_grouped_fp8<false>(t, q, moe_fp8_row_scales(s.xb, P, t.inter), s, max_items, s.y, stream);
    return;
  }
  auto* xb = reinterpret_cast<__nv_bfloat16*>(s.xb);
  launch_moe_gather_bf16(x, P, t.hidden, top_k, s.sorted, s.xb, stream);
  if (t.type == WType::FP8) {
    launch_grouped<WType::FP8, true>(t, xb, s, max_items, h, stream);
    launch_grouped<WType::FP8, false>(t, h, s, max_items, s.y, stream);
  } else {
    launch_grouped<WType::BF16, true>(t, xb, s, max_items, h, stream);
    launch_grouped<WType::BF16, false>(t, h, s, max_items, s.y, stream);
  }
}

}  // namespace moeserve::cuda
