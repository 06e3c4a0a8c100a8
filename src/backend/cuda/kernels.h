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
// terms[0..n) + terms[n..2n) + terms[2n..3n) = x to 2^-24 |x| (three bf16 terms, float32-accurate products).
void launch_to_bf16_terms(const float* x, uint16_t* terms, int64_t n, cudaStream_t s);
void launch_dequant_bf16(const WeightView& w, uint16_t* out, cudaStream_t s);
void launch_dequant_f32(const WeightView& w, float* out, cudaStream_t s);  // exact: fp8 * scale in float32
void launch_argmax(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s);
// Backend::logits_topk (sampling.cu): temperatures [rows] and scratch (logits_topk_scratch_bytes) in device
// memory; out [rows][kLogitsTopkHeaderFloats + 2k], k ≤ kLogitsTopkMax.
constexpr int kLogitsTopkMax = 256;
constexpr int kLogitsTopkHeaderFloats = 6;
size_t logits_topk_scratch_bytes(int64_t rows, int64_t cols, int k);
void launch_logits_topk(const float* x, int64_t rows, int64_t cols, const float* temperatures, int k,
                        void* scratch, float* out, cudaStream_t s);
// Fills n elements of `type` with reproducible pseudo-random values uniform in [-scale, scale) (benchmarks).
void launch_fill_random(void* data, WType type, int64_t n, uint64_t seed, float scale, cudaStream_t s);

// ---- Gated DeltaNet (gdn.cu, gdn_chunked.cu) -------------------------------------------------------------
// How a state slot stores its values (conv and recurrent state alike): float32, or bf16 (widened into float32
// registers, rounded to nearest even when written back).
enum class StateType : int32_t { F32, BF16 };
void launch_gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T,
                      int v_heads, float* beta, float* g, cudaStream_t s);
void launch_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel, void* state,
                        StateType state_type, float* out, cudaStream_t s);
// q, k: rows of [k_heads][dim] every stride floats -> qn, kn [T][k_heads][dim], l2-normalised, qn scaled.
void launch_l2norm_qk(const float* q, const float* k, int64_t stride, int64_t T, int k_heads, int dim,
                      float q_scale, float* qn, float* kn, cudaStream_t s);
// The recurrent form: qn, kn [T][k_heads][k_dim] normalised; v rows of [v_heads][v_dim] every v_stride
// floats; state [v_heads][k_dim][v_dim]; out [T][v_heads][v_dim].
void launch_delta_rule(const float* qn, const float* kn, int k_heads, int k_dim, const float* v,
                       int64_t v_stride, int v_heads, int v_dim, const float* g, const float* beta, int64_t T,
                       void* state, StateType state_type, float* out, cudaStream_t s);
// The chunked (WY) form on tensor cores, same arguments (k_dim = v_dim = 128 only; v rows 16-byte aligned);
// scratch (device) holds delta_rule_chunked_scratch_floats(T, v_heads).
bool delta_rule_chunked_supported(int k_dim, int v_dim, const float* v, int64_t v_stride);
size_t delta_rule_chunked_scratch_floats(int64_t T, int v_heads);
void launch_delta_rule_chunked(const float* qn, const float* kn, int k_heads, const float* v,
                               int64_t v_stride, int v_heads, const float* g, const float* beta, int64_t T,
                               void* state, StateType state_type, float* out, float* scratch, cudaStream_t s);

// Batched decode (n sequences of one token): causal conv + SiLU of qkv [n][C] over conv_states[i] (advanced)
// into conv [n][C]; then per (value head, sequence) the gates from b/a [n][v_heads], q/k l2-normalisation,
// one delta-rule step over states[i] and the gated RMSNorm with z into out [n][v_heads*v_dim]. The state
// pointer arrays are device arrays of device pointers to values of state_type.
bool gdn_decode_supported(int k_dim, int v_dim, int kernel);
void launch_gdn_decode(const float* qkv, const float* z, const float* b, const float* a, int64_t n,
                       int k_heads, int k_dim, int v_heads, int v_dim, const float* conv_w, int kernel,
                       const float* a_log, const float* dt_bias, const float* norm_w, float eps,
                       void* const* conv_states, void* const* states, StateType state_type,
                       bool aligned_states, float* conv, float* out, cudaStream_t s);

// Speculative verify (Backend::gdn_verify): n sequences, sequence i's lengths[i] tokens at rows
// first_rows[i].. of qkv / z / b / a / out, each token with launch_gdn_decode's arithmetic in order over
// conv_states[i] / states[i]; after each token but the last the state also goes to the sequence's next trail
// (conv_trails / trails: Σ (lengths[i] - 1) states, sequence by sequence). first_rows, lengths and the
// pointer arrays are device arrays; conv [rows][C] holds the conv output of every row.
void launch_gdn_verify(const float* qkv, const float* z, const float* b, const float* a, int64_t n,
                       const int64_t* first_rows, const int64_t* lengths, int k_heads, int k_dim, int v_heads,
                       int v_dim, const float* conv_w, int kernel, const float* a_log, const float* dt_bias,
                       const float* norm_w, float eps, void* const* conv_states, void* const* states,
                       void* const* conv_trails, void* const* trails, StateType state_type, float* conv,
                       float* out, cudaStream_t s);

// ---- matmul (gemm.cu) ------------------------------------------------------------------------------------
// Small batches (n ≤ 8 per pass): weight-streaming GEMV with float32 activations.
void launch_gemv(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t s);
// ys[i] = x ws[i]ᵀ for count ≤ kGemvMaxSegments matrices of one dtype, in one launch.
constexpr int kGemvMaxSegments = 4;
void launch_gemv_multi(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                       cudaStream_t s);
// h = silu(x gateᵀ) * (x upᵀ) for small batches, one pass over both matrices.
void launch_gemv_swiglu(const float* x, int64_t n, const WeightView& gate, const WeightView& up, float* h,
                        cudaStream_t s);
// FP8 weights with 128-column block scales, or bf16 weights, against a few activation rows (batched decode)
// on bf16 tensor cores, the weights read once as stored (gemm_fp8.cu): ys[i] = x ws[i]ᵀ for count ≤
// kGemvMaxSegments matrices of one width, one dtype or (≤ 8 rows) FP8 and bf16 mixed. ≤ 8 rows: float32
// accuracy (x split into three bf16 terms); more: x rounded to bf16. x rows 16-byte aligned; scratch (device)
// holds gemm_mma_scratch_bytes.
bool gemm_mma_supported(const WeightView& w);
size_t gemm_mma_scratch_bytes(int64_t n, int64_t cols);
void launch_gemm_mma(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count,
                     void* scratch, cudaStream_t s);
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
  void* k_cache = nullptr;             // this layer's pages: [page][page_size][kv_heads][head_dim] of kv_type
  void* v_cache = nullptr;
  WType kv_type = WType::F32;  // F32, BF16 or FP8 (E4M3: stored = value / scale, read = code * scale)
  float k_scale = 1.0f, v_scale = 1.0f;
  int page_size = 0;
  float* out = nullptr;  // [T][heads][head_dim]
  // Split-K scratch (splits > 1): partial outputs [splits][T*heads][head_dim] and row stats
  // [splits][T*heads].
  int splits = 1;
  float* part_out = nullptr;
  float* part_m = nullptr;
  float* part_l = nullptr;
  // Batched decode: T sequences of one token each; start_pos holds T positions and pages T tables of
  // pages_stride entries. k_new == nullptr: the new rows are in the cache already (attention_decode_prep).
  bool batch = false;
  int64_t pages_stride = 0;
  // Prefill may round Q, K, V and the probabilities to bf16 for tensor cores (the backend's bf16 mode);
  // false keeps the float32 kernel.
  bool tensor_cores = false;
};
bool attention_head_dim_supported(int head_dim);
// Splits of the key range for a call (static per shape, so that recorded steps stay valid).
int attention_splits(int64_t T, int heads, int kv_heads, int64_t capacity);
int attention_decode_splits(int64_t n, int heads, int kv_heads, int64_t capacity);
void launch_attention(const AttentionArgs& a, cudaStream_t s);
// Batched decode prologue for n sequences of one token: q heads (every 2*head_dim floats of qg)
// RMS-normalised (zero-centred q_norm) and RoPE'd into q [n][heads][head_dim]; k [n][kv_heads][head_dim]
// likewise in place (k_norm), then written with v into the cache at positions[i] of page table i (pages
// [n][pages_stride]) of a's kv_type and scales. RoPE rotates by rope_positions[i] (device; the cache position
// plus the sequence's M-RoPE offset).
void launch_attention_decode_prep(const float* qg, float* q, float* k, const float* v, int64_t n,
                                  const float* q_norm, const float* k_norm, float eps, int rotary_dim,
                                  const float* inv_freq, const int64_t* rope_positions,
                                  const AttentionArgs& a, cudaStream_t s);

// ---- the vision tower (vision.cu) ------------------------------------------------------------------------
// x[r][c] += bias[c].
void launch_add_bias(float* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t s);
// LayerNorm over rows of dim (biased variance); out may alias x.
void launch_layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                       float* out, cudaStream_t s);
// GELU in place, exact (erf) or tanh-approximated with k_tanh = sqrt(2/π).
void launch_gelu(float* x, int64_t n, bool tanh_approx, float k_tanh, cudaStream_t s);
// NeoX RoPE with per-row tables cos/sin [rows][rotary_dim/2] (device) on rows of [heads][head_dim] every
// row_stride floats.
void launch_rope_table(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, int rotary_dim,
                       const float* cos, const float* sin, cudaStream_t s);
// Bidirectional attention within segments, in tiles: query rows [q0, q1) of one segment attend to its keys
// [lo, hi). Tiles hold kSegmentTileRowsMma query rows on tensor cores, kSegmentTileRowsSimt otherwise.
struct SegmentTile {
  int32_t q0, q1, lo, hi;
};
constexpr int kSegmentTileRowsMma = 64;
constexpr int kSegmentTileRowsSimt = 8;
struct SegmentAttentionArgs {
  const float* q = nullptr;  // rows of [heads][head_dim] every `stride` floats (k and v alike)
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0;
  int64_t rows = 0;
  int heads = 0, head_dim = 0;
  const SegmentTile* tiles = nullptr;  // device
  int64_t num_tiles = 0;
  // bf16 tensor cores (head_dim ≤ 128; scratch holds segment_attention_scratch_bytes), or float32 SIMT
  // (head_dim ≤ 256).
  bool tensor_cores = false;
  void* scratch = nullptr;
  float* out = nullptr;  // [rows][heads][head_dim]
};
bool segment_attention_mma_supported(int head_dim);
int segment_attention_padded_dim(int head_dim);
size_t segment_attention_scratch_bytes(int64_t rows, int heads, int head_dim, bool tensor_cores);
void launch_segment_attention(const SegmentAttentionArgs& a, cudaStream_t s);

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
  void* h = nullptr;             // [P][inter]: float (SIMT path) or bf16 (tensor-core and pipelined paths)
  uint16_t* xb = nullptr;        // [P][hidden] bf16 gathered inputs (tensor-core and pipelined paths)
  float* y = nullptr;            // [P][hidden]
};
constexpr int kMoeSimtTile = 8;      // tokens per work item, SIMT path
constexpr int kMoeMmaMidTile = 16;   // tokens per work item, mid-size MMA path with many pairs per expert
constexpr int kMoeMmaWideTile = 32;  // tokens per work item, pipelined MMA items with more pairs per expert
constexpr int kMoeMmaTile = 64;      // tokens per work item, tensor-core path
// Rows per work item for n tokens: kMoeMmaTile, kMoeMmaMidTile, kMoeSimtTile, or 1 when pairs are spread thin
// (decode).
// exact (BackendOptions::fp32_matmul): no path that rounds the activations.
int moe_tile(const ExpertTable& t, int64_t n, int top_k, bool tensor_cores, bool exact);
int64_t moe_max_items(int64_t pairs, int experts, int tile);
bool moe_mma_supported(const ExpertTable& t);
// Routed (token, expert) pairs from which the experts run as the grouped GEMM (moe_mma.cu) rather than as MMA
// work items (the table's type, shape and block shape are read). MOESERVE_CUDA_MOE_MMA_MIN_PAIRS overrides
// it.
int64_t moe_grouped_min_pairs(const ExpertTable& t);
// Whether the FP8 x FP8 grouped experts run on wgmma (a compute capability 9.0 device, unless
// MOESERVE_CUDA_MOE_WGMMA=0): then from 4,096 pairs, not 12,288.
bool wgmma_available();
// The tensor-core experts (moe_mma.cu) over the plan's items: gathers x as bf16 into s.xb, h = silu(gate) *
// up into s.h (bf16), y into s.y.
void launch_moe_grouped_mma(const ExpertTable& t, const float* x, int64_t n, int top_k, int64_t max_items,
                            const MoeScratch& s, cudaStream_t stream);
// FP8 weights in 128x128 blocks: the experts' activations are quantized to e4m3 per row and 128 columns
// (fp8_quant.cuh), as the FP8 prefill matmuls, SGLang and vLLM take them, so the MMA is FP8 x FP8.
bool moe_fp8_activations(const ExpertTable& t);
// q[row] = e4m3(in[row]) per 128 columns, scales [rows][cols / 128]. gather: in is float32 x and row r is
// token sorted[r] / top_k's (the gate/up input); else in is bf16 h (the down input).
void launch_moe_quantize_rows(const void* in, bool gather, int64_t rows, int64_t cols, int top_k,
                              const int32_t* sorted, uint8_t* q, float* scales, cudaStream_t stream);
// Where those rows live: the quantized bytes at the start of MoeScratch::xb (2 bytes per element of the
// gathered [P][hidden] inputs), their scales after them; x's for gate/up, then h's for down (inter <=
// hidden).
inline float* moe_fp8_row_scales(uint16_t* xb, int64_t rows, int64_t cols) {
  return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(xb) + (rows * cols + 255) / 256 * 256);
}
// xb[row] = bf16(x[token of the grouped pair row]) for the P pairs (H a multiple of 8).
void launch_moe_gather_bf16(const float* x, int64_t P, int64_t H, int top_k, const int32_t* sorted,
                            uint16_t* xb, cudaStream_t stream);
// The MMA work items of ≤ 16 rows (moe_items.cu; tile kMoeSimtTile or kMoeMmaMidTile, outside exact mode)
// with the weights streamed through a shared-memory pipeline, for bf16 weights and FP8 ones in 128x128
// blocks: gathers x into s.xb (bf16, or e4m3 rows as moe_fp8_row_scales places them), h = silu(gate) * up
// into s.h (bf16), y into s.y. MOESERVE_CUDA_MOE_ITEMS_PIPE=0: moe.cu's items instead.
bool moe_items_pipe_enabled();
// Pairs per expert (on average) from which the pipelined items take kMoeMmaWideTile rows
// (MOESERVE_CUDA_MOE_WIDE_ITEMS_MIN to measure).
int64_t moe_wide_items_min_pairs_per_expert();
bool moe_items_pipe_supported(const ExpertTable& t);
bool moe_items_pipe_used(const ExpertTable& t, int tile, bool tensor_cores, bool exact);
void launch_moe_items_pipe(const ExpertTable& t, const float* x, int64_t n, int top_k, int tile,
                           int64_t max_items, const MoeScratch& s, cudaStream_t stream);
// Decode-sized batches (n ≤ 8): routing, every pair's gate/up and the shared expert's in one launch, then
// the down projections, the weighted combine (ascending expert id) and the shared expert's sigmoid-gated
// output in another. No shared expert: down.data == nullptr.
struct MoeDecodeShared {
  WeightView gate, up, down;
  const float* gate_logit = nullptr;  // [n] shared-expert gate logits
  float* h = nullptr;                 // [n][gate.rows] scratch
};
bool moe_decode_supported(const ExpertTable& t, int top_k, const MoeDecodeShared& shared);
void launch_moe_decode(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize,
                       const float* x, int64_t n, const MoeDecodeShared& shared, const MoeScratch& s,
                       float* out, cudaStream_t stream);
// exact (BackendOptions::fp32_matmul): the activations enter the MMA work items as three bf16 terms.
void launch_moe(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize, const float* x,
                int64_t n, int tile, bool tensor_cores, bool exact, const MoeScratch& s, float* out,
                cudaStream_t stream);
// launch_moe's first and last parts, for experts run elsewhere (cuBLAS's grouped GEMM, cuda_backend.cpp):
// routing and the plan (s.ids, s.weights, s.sorted, s.pair_row, items of ≤ tile rows), then out[t] = the
// routing-weighted sum of its pairs' rows of s.y (float32, or bf16 with bf16_y).
void launch_moe_route(const ExpertTable& t, const float* router_logits, int top_k, bool renormalize,
                      int64_t n, int tile, const MoeScratch& s, cudaStream_t stream);
void launch_moe_combine(const ExpertTable& t, int64_t n, int top_k, const MoeScratch& s, bool bf16_y,
                        float* out, cudaStream_t stream);
// h[p][c] = bf16(silu(gu[p][c]) * gu[p][inter + c]) over bf16 rows [gate | up] of 2 * inter.
void launch_moe_silu_mul_bf16(const uint16_t* gu, int64_t pairs, int64_t inter, uint16_t* h,
                              cudaStream_t stream);

}  // namespace moeserve::cuda
