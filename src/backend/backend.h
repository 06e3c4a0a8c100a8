#pragma once
// Backend: the primitive ops of the Qwen3.5 forward pass. model/qwen35.cpp is written once against this
// interface; the CPU backend is the reference, the CUDA backend must agree with it on the fixtures.
//
// Conventions: activations are float32, row-major, in memory the backend allocated (Buffer); host data
// enters and leaves it through upload/download. Weights are Matrix views (any stored dtype) and float
// vectors in host memory (or already in the backend's memory); a backend that runs elsewhere keeps its own
// copy of each, made by prepare() or on first use, so a weight must stay alive and unchanged while the
// backend lives. "rows" counts tokens (or token×head pairs where stated).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "common/matrix.h"
#include "storage/cache_memory.h"
#include "storage/kv_cache.h"

namespace moeserve {

class Backend;

// One row's record written by Backend::logits_topk, so that sampling needs only these bytes of a logits row:
// a header, then k candidate values (largest first; ties: lower index first) and their column indices.
struct LogitsTopkHeader {
  float max;         // the row's largest value m
  int32_t count;     // candidates present: min(k, cols)
  double sum_exp;    // Σ exp(l - m) over the row (log-softmax normaliser)
  double sum_exp_t;  // Σ exp((l - m) / temperature) over the row
};
static_assert(sizeof(LogitsTopkHeader) == 24);
// Floats per record: the header, k values, k indices (int32 stored in float slots).
constexpr int64_t logits_topk_record_floats(int k) {
  return int64_t(sizeof(LogitsTopkHeader) / sizeof(float)) + 2 * int64_t(k);
}
// Candidates a backend reduces one row to at most.
constexpr int kMaxLogitsTopk = 256;

// A Buffer returns its memory to the backend that allocated it (which may keep it for the next request of
// the same size: activations are allocated per layer, and fresh pages cost a fault each).
struct BufferDeleter {
  Backend* owner = nullptr;
  size_t floats = 0;
  void operator()(float* p) const;
};
using Buffer = std::unique_ptr<float[], BufferDeleter>;

// Gated DeltaNet recurrence dimensions: value head h reads key head h / (v_heads / k_heads).
struct DeltaRuleShape {
  int k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Uninitialised memory for `floats` values.
  virtual Buffer allocate(size_t floats) = 0;
  virtual void release(float* p, size_t floats) = 0;
  virtual void fill_zero(float* x, size_t n) = 0;
  virtual void copy(const float* src, float* dst, size_t n) = 0;
  // Host memory into backend memory and back (plain copies on the CPU). download returns once `host` holds
  // the data, except inside run_step, where it holds it when run_step returns.
  virtual void upload(const float* host, float* dst, size_t n) { copy(host, dst, n); }
  virtual void download(const float* src, float* host, size_t n) { copy(src, host, n); }

  // Makes a weight resident where the ops run, ahead of the first step (nothing to do on the CPU).
  virtual void prepare(const Matrix& w) { (void)w; }
  virtual void prepare(const float* weights, size_t n) { (void)weights, (void)n; }
  // Memory for the KV pages and GDN state slots (nullptr: host memory).
  virtual CacheMemory* cache_memory() { return nullptr; }
  // Free and total bytes of the memory the backend allocates from (a GPU's device memory), for the server's
  // memory-pressure sensing and what the engine's mem_fraction is a share of; nullopt where that is host
  // memory, which the server and the engine read themselves. Thread-safe.
  struct MemoryInfo {
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
  };
  virtual std::optional<MemoryInfo> device_memory() const { return std::nullopt; }
  // A random weight made in the backend's own memory and owned by the backend: rows×cols of `dtype` (BF16 or
  // F32 uniform in [-bound, bound); F8_E4M3 with 128x128 block scales, |w| ≤ bound) (benchmarks,
  // `serve --load-format dummy [--quantization fp8]`). An empty Matrix where the
  // backend runs on host memory (make host weights instead).
  virtual Matrix random_matrix(DType dtype, int64_t rows, int64_t cols, uint64_t seed, float bound) {
    (void)dtype, (void)rows, (void)cols, (void)seed, (void)bound;
    return {};
  }

  // Runs `step` (a forward step: ops, then downloads of its results) so that a backend may record the device
  // work the first times it sees `key` and replay the recording afterwards (CUDA graphs). The CPU runs it.
  //
  // The graph contract, which every op of a recording backend keeps (docs/cuda.md, "CUDA graphs"): on a
  // replay the host code of `step` runs again with the ops issuing nothing, so a replay equals an eager run
  // only if each op
  //  - stages each host input it reads (token ids, positions, page tables, state slot pointers,
  //    temperatures, uploaded data) into the step's staging memory, never handing a kernel a host value or
  //    pointer directly: the replay then reads this call's inputs, not the recorded call's;
  //  - folds each argument the recording baked in (device addresses, shapes, weights, dtypes, counts and
  //    every launch choice made from a host value) into the step's signature: a step that differs from the
  //    recording in any of them runs afresh instead of replaying another step's work.
  // tests/backend/cuda/cuda_replay_test.cpp holds each op to it (record, change inputs and slots, replay,
  // compare with eager); a new op gets a case there.
  virtual void run_step(uint64_t key, const std::function<void()>& step) {
    (void)key;
    step();
  }

  // Greedy sampling: out[r] = index of the largest value of row r of x [rows][cols] (the first on ties).
  virtual void argmax(const float* x, int64_t rows, int64_t cols, int32_t* out_host);
  // Sampling where the logits are: per row r of x [rows][cols], its max m, Σ exp(l - m), Σ exp((l - m) /
  // temperatures[r]) and its k ≤ kMaxLogitsTopk largest values with their indices, into out [rows][
  // logits_topk_record_floats(k)] (backend memory; layout: LogitsTopkHeader, values, indices). The sums run
  // in double here (column order, as the host sampler sums a full row); a GPU may sum in float32.
  virtual void logits_topk(const float* x, int64_t rows, int64_t cols, std::span<const float> temperatures,
                           int k, float* out);

  // y[n][w.rows] = x[n][w.cols] · wᵀ
  virtual void matmul(const float* x, int64_t n, const Matrix& w, float* y) = 0;
  // out[i] = table row tokens[i]
  virtual void embed(std::span<const int32_t> tokens, const Matrix& table, float* out) = 0;
  // x += y
  virtual void add(float* x, const float* y, size_t n) = 0;
  // The residual add fused with the next zero-centred RMSNorm: h += y, then out = rms_norm(h) (rows of dim).
  virtual void add_rms_norm(float* h, const float* y, int64_t rows, int64_t dim, const float* w, float eps,
                            float* out) {
    add(h, y, size_t(rows * dim));
    rms_norm(h, rows, dim, dim, w, eps, true, out, dim);
  }

  // RMSNorm over rows of `dim`: out = x * rsqrt(mean(x²) + eps) * (zero_centred ? 1 + w : w).
  // Rows start every x_stride (resp. out_stride) floats, so a norm can read heads out of interleaved rows.
  virtual void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w,
                        float eps, bool zero_centred, float* out, int64_t out_stride) = 0;
  // Gated RMSNorm (GDN output): out = w * (o * rsqrt(mean(o²) + eps)) * silu(z), rows of `dim`.
  virtual void gated_rms_norm(const float* o, const float* z, int64_t rows, int64_t dim, const float* w,
                              float eps, float* out) = 0;

  // Partial NeoX RoPE in place on x [tokens][heads][head_dim]: dims [0, rotary_dim) rotate pairs (j, j+half)
  // by the angle (start_pos + token) * inv_freq[j] (float32, as HF computes it); the rest pass through.
  virtual void rope(float* x, int64_t tokens, int heads, int head_dim, int rotary_dim, int64_t start_pos,
                    const float* inv_freq) = 0;

  // Causal attention of one sequence over the paged cache. Writes k_new/v_new [T][kv_heads][head_dim] into
  // positions [start_pos, start_pos+T) of `pages`, then out[T][heads][head_dim] = softmax(q kᵀ·scale) v over
  // positions ≤ start_pos + t. GQA: head h uses kv head h / (heads / kv_heads).
  virtual void paged_attention(const float* q, const float* k_new, const float* v_new, int64_t T, int heads,
                               int kv_heads, int head_dim, int64_t start_pos, std::span<const int32_t> pages,
                               KvCache& kv, int layer, float* out) = 0;
  // x[i] *= sigmoid(gate[i]) for rows of `dim`, gate rows every gate_stride floats.
  virtual void mul_sigmoid(float* x, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) = 0;

  // Depthwise causal conv1d + SiLU of one sequence: x [T][channels], w [channels][kernel]; state
  // [channels][kernel-1] holds the previous inputs (oldest first) and is advanced to the last kernel-1
  // inputs.
  virtual void causal_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel,
                                  float* state, float* out) = 0;
  // beta = sigmoid(b); g = -exp(a_log) * softplus(a + dt_bias); all [T][v_heads].
  virtual void gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T,
                         int v_heads, float* beta, float* g) = 0;
  // The gated delta rule of one sequence (l2-normalises q and k, scales q by 1/sqrt(k_dim)):
  // q, k rows of [k_heads][k_dim] every qk_stride floats; v rows of [v_heads][v_dim] every v_stride floats;
  // state [v_heads][k_dim][v_dim] advanced in place; out [T][v_heads][v_dim].
  virtual void gated_delta_rule(const DeltaRuleShape& s, const float* q, const float* k, int64_t qk_stride,
                                const float* v, int64_t v_stride, const float* g, const float* beta,
                                int64_t T, float* state, float* out) = 0;

  // SwiGLU feed-forward on n rows: out = down(silu(gate x) * up x).
  virtual void swiglu(const SwiGlu& w, const float* x, int64_t n, float* out) = 0;
  // Routed experts: softmax over router logits [n][experts], top-k (renormalised if asked), and
  // out[i] = Σ_k w_k · expert_{e_k}(x[i]) (experts applied in ascending id, as HF accumulates).
  virtual void moe_experts(std::span<const SwiGlu> experts, const float* router_logits, int top_k,
                           bool renormalize, const float* x, int64_t n, int64_t hidden, float* out) = 0;
  // out[i] += sigmoid(gate_logit[i]) * y[i], rows of `dim` (the shared expert's gate).
  virtual void add_sigmoid_gated(float* out, const float* y, const float* gate_logit, int64_t rows,
                                 int64_t dim) = 0;

  // The vision tower's ops (vision/tower.cpp). The defaults (backend/vision_ops.cpp) run on the host through
  // download/upload, so every backend has them; a backend may run them where its memory is.
  // x[r][c] += bias[c] (bias in host memory, like norm weights).
  virtual void add_bias(float* x, const float* bias, int64_t rows, int64_t dim);
  // LayerNorm over rows of dim: out = (x - mean) / sqrt(var + eps) * w + b (biased variance, float32).
  virtual void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b,
                          float eps, float* out);
  // GELU in place: x·Φ(x) with the exact erf, or torch's tanh approximation.
  virtual void gelu(float* x, size_t n, bool tanh_approx);
  // NeoX RoPE in place with a per-row table: row r ([heads][head_dim] at x + r·row_stride), dims
  // [0, rotary_dim) of every head rotate pairs (j, j+half) by the angle whose cos/sin are cos[r][j] /
  // sin[r][j] (backend memory, [rows][rotary_dim/2]: uploaded once, a table serves many calls).
  virtual void rope_table(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, int rotary_dim,
                          const float* cos, const float* sin);
  // Bidirectional attention within segments: rows [starts[i], starts[i+1]) attend to each other only;
  // q, k, v rows of [heads][head_dim] every `stride` floats; out [rows][heads][head_dim]; scale
  // 1/sqrt(head_dim). starts begins at 0 and ends at the row count.
  virtual void segment_attention(const float* q, const float* k, const float* v, int64_t stride, int heads,
                                 int head_dim, std::span<const int64_t> starts, float* out);

  // Composite ops, so a backend can run them as fewer kernels; the defaults compose the ops above.
  // ys[i][n][ws[i].rows] = x · ws[i]ᵀ for every matrix (one pass over x).
  virtual void matmul_n(const float* x, int64_t n, std::span<const Matrix* const> ws,
                        std::span<float* const> ys);
  // The Gated DeltaNet core of n sequences of one token each (decode): per sequence i, the causal conv + SiLU
  // of its row of qkv [n][2*key_dim + value_dim] over conv_states[i], gates from b/a [n][v_heads], the gated
  // delta rule over states[i] (q, k, v columns of the conv output), then the gated RMSNorm with z and norm_w:
  // out [n][value_dim].
  virtual void gdn_decode(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b,
                          const float* a, int64_t n, const float* conv_w, int kernel, const float* a_log,
                          const float* dt_bias, const float* norm_w, float eps,
                          std::span<float* const> conv_states, std::span<float* const> states, float* out);
  // The Gated DeltaNet core of a speculative verify step (engine/speculative.h): n sequences, sequence i's
  // lengths[i] ≥ 1 tokens at rows first_rows[i] .. of qkv [rows][2*key_dim + value_dim], z, b, a and out
  // (the layouts of gdn_decode). Each token runs gdn_decode's arithmetic, in order, over conv_states[i] /
  // states[i], so a verified token gets what plain decoding gives it; after each token but the last the
  // sequence's state is also written to its next trail slot (a rollback point): conv_trails / trails hold
  // Σ (lengths[i] - 1) states, sequence by sequence, in the states' storage.
  virtual void gdn_verify(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b,
                          const float* a, std::span<const int64_t> first_rows,
                          std::span<const int64_t> lengths, const float* conv_w, int kernel,
                          const float* a_log, const float* dt_bias, const float* norm_w, float eps,
                          std::span<float* const> conv_states, std::span<float* const> states,
                          std::span<float* const> conv_trails, std::span<float* const> trails, float* out);
  // The gated-attention core of n sequences of one token each (decode): per sequence i, its query heads
  // (every 2*head_dim floats of qg: head_dim query values, then head_dim gate values) and its key heads in k
  // [n][kv_heads][head_dim] are RMS-normalised (zero-centred q_norm / k_norm) and RoPE'd at positions[i] +
  // rope_offsets[i] (empty: no offsets), the key and value rows written into pages[i] of the cache at
  // positions[i], and out [n][heads][head_dim] = attention over positions ≤ positions[i] (the gate is not
  // applied). k is overwritten. An offset is M-RoPE's rope_delta: text after an image rotates behind its
  // cache index, on all three axes alike, so one position per token still describes it.
  virtual void attention_decode(const float* qg, float* k, const float* v, int64_t n, int heads, int kv_heads,
                                int head_dim, const float* q_norm, const float* k_norm, float eps,
                                int rotary_dim, const float* inv_freq, std::span<const int64_t> positions,
                                std::span<const int64_t> rope_offsets,
                                std::span<const std::span<const int32_t>> pages, KvCache& kv, int layer,
                                float* out);
  // A mixture-of-experts feed-forward: router logits x · routerᵀ, the routed experts (as moe_experts) into
  // out, and with a shared expert out += sigmoid(x · shared_gateᵀ) * shared(x) (shared_gate [1, hidden]).
  virtual void moe_block(const Matrix& router, std::span<const SwiGlu> experts, int top_k, bool renormalize,
                         const SwiGlu* shared, const Matrix* shared_gate, const float* x, int64_t n,
                         int64_t hidden, float* out);
};

inline void BufferDeleter::operator()(float* p) const {
  if (owner && p) owner->release(p, floats);
}

// The reference CPU backend (multi-threaded on ThreadPool::global(), SIMD via Highway).
std::unique_ptr<Backend> make_cpu_backend();

struct BackendOptions {
  // CUDA: keep float32 activations in every matmul (no bf16 rounding for the tensor cores); slower prefill,
  // but agrees with the CPU to float32 rounding.
  bool fp32_matmul = false;
};

// A backend by device name: "cpu", or "cuda" (a build with -DMOESERVE_CUDA=ON and a visible GPU).
std::unique_ptr<Backend> make_backend(std::string_view device, const BackendOptions& options = {});
// Whether make_backend("cuda") can work here: the CUDA backend is built in and a device is visible.
bool cuda_available();

}  // namespace moeserve
