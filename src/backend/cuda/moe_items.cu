// The experts of mid-size batches (the plan's work items of ≤ 32 rows: batches of ~9 to a few thousand
// tokens) on tensor cores, with the weights streamed through a cp.async pipeline.
//
// Here few tokens meet each expert, so the weights are the bytes to move and the tokens are the MMA's narrow
// side: a work item's rows are the n8 tiles of mma.sync (one, two or four), the weight rows its m16 tiles. A
// block of 4 warps takes 128 weight rows of one item's expert (gate/up: 64 gate rows and the 64 up rows
// beside them, so silu(gate) * up is formed in registers; down: 128 rows) and streams them in stages of 128
// bytes a row, four stages in flight, with the item's activations of the same columns. The kernels of moe.cu
// load each warp's weights into registers one chunk at a time and kept too few bytes in flight (batch 256:
// bf16 at 62% of HBM bandwidth).
//
// bf16 weights: stages of 64 columns, m16n8k16 with the activations and h rounded to bf16 (as moe.cu's MMA
// items round them). FP8 weights in 128x128 blocks: stages of 128 columns (one block scale), m16n8k32 e4m3
// with the activations and h quantized to e4m3 per row and 128 columns (moe_fp8_activations), each stage's
// partial sums scaled by the weight block's and the row's scales. Widening the FP8 weights to bf16 instead
// made the kernel issue-bound (ncu: DRAM 43% busy at batch 256, against bf16's 81%).
#include <cuda_bf16.h>

#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kRows = 128;      // weight rows per block
constexpr int kThreads = 128;   // 4 warps of 32 weight rows (two m16 tiles) each
constexpr int kRowBytes = 128;  // bytes per weight or activation row and stage: 8 chunks of 16
constexpr int kStages = 4;
constexpr int kWTile = kRows * kRowBytes;

template <WType T>
constexpr int stage_cols() {
  return kRowBytes / (T == WType::FP8 ? 1 : 2);
}
template <int kNT>
constexpr int smem_bytes() {
  return kStages * (kWTile + kNT * 8 * kRowBytes);
}

// Rows in shared memory are XOR-swizzled by 16-byte chunk so that each quarter warp's 16-byte fragment loads
// (lanes g = 2a, 2a+1 and q = 0..3: two adjacent rows) hit distinct bank groups: FP8 fragments read chunks q
// and q + 4 of a row, bf16 ones chunks 2q and 2q + 1.
template <WType T>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return chunk ^ ((row & 1) << (T == WType::FP8 ? 2 : 0));
}
template <WType T>
__device__ __forceinline__ uint4 load_chunk(const uint8_t* tile, int row, int chunk) {
  return *reinterpret_cast<const uint4*>(tile + row * kRowBytes + swizzle<T>(row, chunk) * 16);
}

// Issues the cp.async copies of the stage at column k0: the block's 128 weight rows (shared row r is gate row
// n0 + r (r < 64) or up row n0 + r - 64 for gate/up, down row n0 + r for down) and the item's activation
// rows; rows past the item or the matrix are zero-filled.
template <WType T, int kNT>
__device__ __forceinline__ void load_stage(const uint8_t* const (&base)[2], int64_t n0, int64_t limit,
                                           bool gate_up, int64_t K, const uint8_t* __restrict__ act,
                                           int first, int count, int64_t k0, uint8_t* ws, uint8_t* xs) {
  constexpr int64_t B = T == WType::FP8 ? 1 : 2;
#pragma unroll
  for (int c = threadIdx.x; c < kRows * 8; c += kThreads) {
    const int r = c >> 3, ch = c & 7;
    const int64_t i = n0 + (gate_up ? r & 63 : r);
    const bool live = i < limit;
    cp_async16(ws + r * kRowBytes + swizzle<T>(r, ch) * 16,
               (gate_up && r >= 64 ? base[1] : base[0]) + ((live ? i : 0) * K + k0) * B + ch * 16, live);
  }
#pragma unroll
  for (int c = threadIdx.x; c < kNT * 8 * 8; c += kThreads) {
    const int r = c >> 3, ch = c & 7;
    const bool live = r < count;
    cp_async16(xs + r * kRowBytes + swizzle<T>(r, ch) * 16,
               act + ((int64_t(first) + (live ? r : 0)) * K + k0) * B + ch * 16, live);
  }
}

__device__ __forceinline__ uint32_t word(const uint4 (&w)[2], int i) {
  const uint4& u = w[i >> 2];
  return (i & 3) == 0 ? u.x : (i & 3) == 1 ? u.y : (i & 3) == 2 ? u.z : u.w;
}

// part[m][j] += this warp's weight rows (m16 tile m: shared rows rows[2m] and rows[2m + 1] = that + 8) times
// token tile j over one stage. Thread (g, q) holds 32 bytes of each of its rows and of token 8j + g's row
// (FP8: chunks q and q + 4; bf16: chunks 2q and 2q + 1): 8 words, of which each MMA step takes two (for A
// at rows g and g + 8, for B at token g). The MMA's column order is thus a permutation of the stage's
// columns, the same for weights and activations, so the products are those of the true order.
template <WType T, int kNT>
__device__ __forceinline__ void stage_mma(const uint8_t* ws, const uint8_t* xs, const int (&rows)[4], int g,
                                          int q, float (&part)[2][kNT][4]) {
  constexpr bool kFp8 = T == WType::FP8;
  const int c0 = kFp8 ? q : 2 * q, c1 = kFp8 ? q + 4 : 2 * q + 1;
  uint4 xv[kNT][2], wv[4][2];
#pragma unroll
  for (int j = 0; j < kNT; ++j)
    xv[j][0] = load_chunk<T>(xs, 8 * j + g, c0), xv[j][1] = load_chunk<T>(xs, 8 * j + g, c1);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    wv[i][0] = load_chunk<T>(ws, rows[i], c0), wv[i][1] = load_chunk<T>(ws, rows[i], c1);
    // FP8: 4 steps of k32 (words 2s, 2s + 1 hold four e4m3 each); bf16: 4 steps of k16 (two bf16 each).
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t a0 = word(wv[2 * m], 2 * s), a1 = word(wv[2 * m + 1], 2 * s);
      const uint32_t a2 = word(wv[2 * m], 2 * s + 1), a3 = word(wv[2 * m + 1], 2 * s + 1);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        if constexpr (kFp8)
          mma_e4m3(part[m][j], a0, a1, a2, a3, word(xv[j], 2 * s), word(xv[j], 2 * s + 1));
        else
          mma_bf16(part[m][j], a0, a1, a2, a3, word(xv[j], 2 * s), word(xv[j], 2 * s + 1));
      }
    }
}

// gate/up (kGateUp): h[row][n0 + 16w + ..] = bf16(silu(x · gate) * (x · up)) for the item's rows, the block
// covering h columns n0..n0+63. down: y[row][n0 + 32w + ..] = h · down (float32), the block covering 128
// output columns. act holds the item's rows (gathered x, or h): bf16, or e4m3 with scales [row][K / 128].
template <WType T, int kNT, bool kGateUp>
__global__ __launch_bounds__(kThreads) void moe_items_pipe(ExpertTable t, const uint8_t* __restrict__ act,
                                                           const float* __restrict__ act_scales,
                                                           const int32_t* __restrict__ items,
                                                           const int32_t* __restrict__ num_items,
                                                           void* __restrict__ out) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  if (int(blockIdx.y) >= *num_items) return;
  const int32_t* it = items + 3 * blockIdx.y;
  const int e = it[0], first = it[1], count = it[2];
  const int64_t K = kGateUp ? t.hidden : t.inter, N = kGateUp ? t.inter : t.hidden;
  const int64_t n0 = int64_t(blockIdx.x) * (kGateUp ? kRows / 2 : kRows);
  const uint8_t* base[2] = {static_cast<const uint8_t*>(kGateUp ? t.gate[e] : t.down[e]),
                            static_cast<const uint8_t*>(kGateUp ? t.up[e] : t.down[e])};

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  // The warp's shared rows: gate/up m tile 0 = gate rows 16w + (0..15), m tile 1 = the up rows beside them;
  // down: rows 32w + (0..31).
  int rows[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    rows[i] = kGateUp ? (i >> 1) * 64 + 16 * warp + g + 8 * (i & 1) : 32 * warp + g + 8 * i;
  // FP8: each m tile's rows lie in one 128-row scale block; the accumulator columns' tokens (2q, 2q + 1 of
  // each token tile, clamped to the item) have one activation scale per stage.
  constexpr bool kFp8 = T == WType::FP8;
  const float* w_scale[2] = {nullptr, nullptr};
  const float* x_scale[kNT][2];
  if constexpr (kFp8) {
    const int scale_cols = int(K / kFp8QuantBlock);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int64_t row = n0 + (kGateUp ? 16 * warp : 32 * warp + 16 * m);
      const float* s = kGateUp ? (m ? t.up_scale[e] : t.gate_scale[e]) : t.down_scale[e];
      w_scale[m] = s + (imin<int64_t>(row, N - 1) / kFp8QuantBlock) * scale_cols;
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int b = 0; b < 2; ++b)
        x_scale[j][b] = act_scales + int64_t(first + imin(8 * j + 2 * q + b, count - 1)) * scale_cols;
  }

  auto w_stage = [&](int st) { return smem + st * kWTile; };
  auto x_stage = [&](int st) { return smem + kStages * kWTile + st * kNT * 8 * kRowBytes; };
  constexpr int kCols = stage_cols<T>();
  const int tiles = int(K / kCols);
  auto load = [&](int kt) {
    load_stage<T, kNT>(base, n0, N, kGateUp, K, act, first, count, int64_t(kt) * kCols, w_stage(kt % kStages),
                       x_stage(kt % kStages));
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < tiles) load(st);
    cp_async_commit();
  }
  float acc[2][kNT][4] = {};
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is in; every warp is done with the stage the next load overwrites
    if (kt + kStages - 1 < tiles) load(kt + kStages - 1);
    cp_async_commit();
    if constexpr (kFp8) {
      float ws[2], xs[kNT][2];
#pragma unroll
      for (int m = 0; m < 2; ++m) ws[m] = __ldg(w_scale[m] + kt);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
        xs[j][0] = __ldg(x_scale[j][0] + kt), xs[j][1] = __ldg(x_scale[j][1] + kt);
      float part[2][kNT][4] = {};
      stage_mma<T, kNT>(w_stage(kt % kStages), x_stage(kt % kStages), rows, g, q, part);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[m][j][c] = fmaf(ws[m] * xs[j][c & 1], part[m][j][c], acc[m][j][c]);
    } else {
      stage_mma<T, kNT>(w_stage(kt % kStages), x_stage(kt % kStages), rows, g, q, acc);
    }
  }

  // Accumulator c of (m, j): weight row rows[2m] + 8 (c / 2), token 8j + 2q + c % 2 of the item.
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int b = 8 * j + 2 * q + (c & 1);
      if (b >= count) continue;
      const int64_t row = int64_t(first) + b;
      if constexpr (kGateUp) {
        const int64_t col = n0 + 16 * warp + g + 8 * (c >> 1);
        if (col < N)
          static_cast<__nv_bfloat16*>(out)[row * N + col] =
              __float2bfloat16_rn(siluf_(acc[0][j][c]) * acc[1][j][c]);
      } else {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int64_t col = n0 + 32 * warp + 16 * m + g + 8 * (c >> 1);
          if (col < N) static_cast<float*>(out)[row * N + col] = acc[m][j][c];
        }
      }
    }
}

template <WType T, int kNT, bool kGateUp>
void launch_pass(const ExpertTable& t, const void* act, const float* act_scales, int64_t max_items,
                 const MoeScratch& s, void* out, cudaStream_t stream) {
  static const bool configured = [] {
    cudaFuncSetAttribute(moe_items_pipe<T, kNT, kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         smem_bytes<kNT>());
    return true;
  }();
  (void)configured;
  const int64_t N = kGateUp ? t.inter : t.hidden, per_block = kGateUp ? kRows / 2 : kRows;
  launch_k(moe_items_pipe<T, kNT, kGateUp>,
           dim3(unsigned((N + per_block - 1) / per_block), unsigned(max_items)), kThreads,
           size_t(smem_bytes<kNT>()), stream, t, static_cast<const uint8_t*>(act), act_scales, s.items,
           s.num_items, out);
}

template <int kNT>
void launch_items(const ExpertTable& t, const float* x, int64_t P, int top_k, int64_t max_items,
                  const MoeScratch& s, cudaStream_t stream) {
  if (t.type == WType::FP8) {
    auto* q = reinterpret_cast<uint8_t*>(s.xb);
    float* xs = moe_fp8_row_scales(s.xb, P, t.hidden);
    launch_moe_quantize_rows(x, true, P, t.hidden, top_k, s.sorted, q, xs, stream);
    launch_pass<WType::FP8, kNT, true>(t, q, xs, max_items, s, s.h, stream);
    float* hs = moe_fp8_row_scales(s.xb, P, t.inter);
    launch_moe_quantize_rows(s.h, false, P, t.inter, top_k, s.sorted, q, hs, stream);
    launch_pass<WType::FP8, kNT, false>(t, q, hs, max_items, s, s.y, stream);
  } else {
    launch_moe_gather_bf16(x, P, t.hidden, top_k, s.sorted, s.xb, stream);
    launch_pass<WType::BF16, kNT, true>(t, s.xb, nullptr, max_items, s, s.h, stream);
    launch_pass<WType::BF16, kNT, false>(t, s.h, nullptr, max_items, s, s.y, stream);
  }
}

}  // namespace

bool moe_items_pipe_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOESERVE_CUDA_MOE_ITEMS_PIPE");  // 0: moe.cu's register-fed MMA items
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool moe_items_pipe_supported(const ExpertTable& t) {
  return (t.type == WType::BF16 && t.hidden % 64 == 0 && t.inter % 64 == 0) || moe_fp8_activations(t);
}

int64_t moe_wide_items_min_pairs_per_expert() {
  static const int64_t v = [] {
    const char* e = std::getenv("MOESERVE_CUDA_MOE_WIDE_ITEMS_MIN");
    return e ? std::atoll(e) : int64_t(24);
  }();
  return v;
}

void launch_moe_items_pipe(const ExpertTable& t, const float* x, int64_t n, int top_k, int tile,
                           int64_t max_items, const MoeScratch& s, cudaStream_t stream) {
  if (tile > kMoeMmaMidTile)
    launch_items<4>(t, x, n * top_k, top_k, max_items, s, stream);
  else if (tile > kMoeSimtTile)
    launch_items<2>(t, x, n * top_k, top_k, max_items, s, stream);
  else
    launch_items<1>(t, x, n * top_k, top_k, max_items, s, stream);
}

}  // namespace moeserve::cuda
