#pragma once
// Launchers of the CUDA backend's kernels (plain C++ declarations, so the backend itself compiles with the
// host compiler). Every launcher enqueues on `stream` and returns at once; pointers are device pointers
// unless stated. Values that change from step to step (positions, page tables, token ids) are passed as
// device pointers, so that a recorded step (CUDA graph) can be replayed with new ones.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moeserve::cuda {

enum class WType : int32_t { F32, F16, BF16, FP8 };

// A weight matrix in device memory: y = x Wᵀ with W [rows][cols]; FP8 carries block scales.
struct WeightView {
  WType type = WType::BF16;
  const void* data = nullptr;
  const float* scale_inv = nullptr;  // [ceil(rows/block_rows)][scale_cols], FP8 only
  int64_t rows = 0, cols = 0;
  int block_rows = 0, block_cols = 0;
  int64_t scale_cols = 0;
};

// ---- elementwise and row ops (elementwise.cu) ------------------------------------------------------------
void launch_add(float* x, const float* y, int64_t n, cudaStream_t s);
void launch_rms_norm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, float eps,
                     bool zero_centred, float* out, int64_t out_stride, cudaStream_t s);
void launch_add_rms_norm(float* h, const float* y, int64_t rows, int64_t dim, const float* w, float eps,
                         float* out, cudaStream_t s);
void launch_gated_rms_norm(const float* o, const float* z, int64_t rows, int64_t dim, const float* w,
                           float eps, float* out, cudaStream_t s);
void launch_rope(float* x, int64_t tokens, int heads, int head_dim, int rotary_dim, const int64_t* start_pos,
                 const float* inv_freq, cudaStream_t s);
void launch_embed(const int32_t* tokens, int64_t n, const WeightView& table, float* out, cudaStream_t s);
void launch_mul_sigmoid(float* x, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride,
                        cudaStream_t s);
void launch_add_sigmoid_gated(float* out, const float* y, const float* gate, int64_t rows, int64_t dim,
                              cudaStream_t s);
void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
void launch_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t s);
void launch_dequant_bf16(const WeightView& w, uint16_t* out, cudaStream_t s);
void launch_argmax(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s);
// Fills n elements of `type` with reproducible pseudo-random values uniform in [-scale, scale) (benchmarks).
void launch_fill_random(void* data, WType type, int64_t n, uint64_t seed, float scale, cudaStream_t s);

// ---- Gated DeltaNet (gdn.cu) -----------------------------------------------------------------------------
void launch_gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T,
                      int v_heads, float* beta, float* g, cudaStream_t s);
void launch_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel, float* state,
                        float* out, cudaStream_t s);
// q, k: rows of [k_heads][dim] every stride floats -> qn, kn [T][k_heads][dim], l2-normalised, qn scaled.
void launch_l2norm_qk(const float* q, const float* k, int64_t stride, int64_t T, int k_heads, int dim,
                      float q_scale, float* qn, float* kn, cudaStream_t s);
// qn, kn [T][k_heads][k_dim] normalised; v rows of [v_heads][v_dim] every v_stride floats; state
// [v_heads][k_dim][v_dim]; out [T][v_heads][v_dim].
void launch_delta_rule(const float* qn, const float* kn, int k_heads, int k_dim, const float* v,
                       int64_t v_stride, int v_heads, int v_dim, const float* g, const float* beta, int64_t T,
                       float* state, float* out, cudaStream_t s);

// ---- matmul (gemm.cu) ------------------------------------------------------------------------------------
// Small batches (n ≤ 8 per pass): weight-streaming GEMV with float32 activations.
void launch_gemv(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s);
// h = silu(x gateᵀ) * (x upᵀ) for small batches, one pass over both matrices.
void launch_gemv_swiglu(const float* x, int64_t n, const WeightView& gate, const WeightView& up, float* h,
                        cudaStream_t s);
// Tiled float32 GEMM over any weight dtype (exact mode and dtypes cuBLAS does not take).
void launch_gemm_simt(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s);

// ---- attention (attention.cu) ----------------------------------------------------------------------------
struct AttentionArgs {
  const float* q = nullptr;  // [T][heads][head_dim]
  const float* k_new = nullptr;
  const float* v_new = nullptr;  // [T][kv_heads][head_dim]
  int64_t T = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  const int64_t* start_pos = nullptr;  // device scalar
  const int32_t* pages = nullptr;      // device page table
  int64_t num_pages = 0;               // entries in the page table (capacity = num_pages * page_size)
  float* k_cache = nullptr;            // this layer's pages: [page][page_size][kv_heads][head_dim]
  float* v_cache = nullptr;
  int page_size = 0;
  float* out = nullptr;  // [T][heads][head_dim]
  // Split-K scratch (splits > 1): partial outputs [splits][T*heads][head_dim] and row stats
  // [splits][T*heads].
  int splits = 1;
  float* part_out = nullptr;
  float* part_m = nullptr;
  float* part_l = nullptr;
};
bool attention_head_dim_supported(int head_dim);
// Splits of the key range for a call (static per shape, so that recorded steps stay valid).
int attention_splits(int64_t T, int heads, int kv_heads, int64_t capacity);
void launch_attention(const AttentionArgs& a, cudaStream_t s);

// ---- mixture of experts (moe.cu) -------------------------------------------------------------------------
// Device tables of per-expert weights (uniform dtype and shape).
struct ExpertTable {
  WType type = WType::BF16;
  int experts = 0;
  int64_t hidden = 0, inter = 0;
  const void* const* gate = nullptr;  // [experts] -> [inter][hidden]
  const void* const* up = nullptr;
  const void* const* down = nullptr;  // -> [hidden][inter]
  const float* const* gate_scale = nullptr;
  const float* const* up_scale = nullptr;
  const float* const* down_scale = nullptr;
  int block_rows = 0, block_cols = 0;
};
struct MoeScratch {
  int32_t* ids = nullptr;        // [P] expert of pair p = t*top_k + j
  float* weights = nullptr;      // [P]
  int32_t* sorted = nullptr;     // [P] pairs grouped by expert
  int32_t* pair_row = nullptr;   // [P] row of pair p in the grouped order
  int32_t* items = nullptr;      // [max_items][3] (expert, first row, rows)
  int32_t* num_items = nullptr;  // device scalar
  void* h = nullptr;             // [P][inter]: float (SIMT path) or bf16 (tensor-core path)
  uint16_t* xb = nullptr;        // [P][hidden] bf16 gathered inputs (tensor-core path)
  float* y = nullptr;            // [P][hidden]
};
constexpr int kMoeSimtTile = 8;  // tokens per work item, SIMT path
constexpr int kMoeMmaTile = 64;  // tokens per work item, tensor-core path
// Rows per work item for n tokens: kMoeMmaTile, kMoeSimtTile, or 1 when pairs are spread thin (decode).
int moe_tile(int64_t n, int top_k, int experts, bool tensor_cores);
int64_t moe_max_items(int64_t pairs, int experts, int tile);
bool moe_mma_supported(const ExpertTable& t);
void launch_moe(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize, const float* x,
                int64_t n, bool tensor_cores, const MoeScratch& s, float* out, cudaStream_t stream);

}  // namespace moeserve::cuda
