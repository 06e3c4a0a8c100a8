// The reference CPU backend: float32 arithmetic on weights of any stored dtype, parallel over the global
// thread pool. Written for clarity first; the hot loops (dot products) are SIMD via backend/cpu/simd.h.

#include <algorithm>
#include <bit>
#include <mutex>
#include <new>
#include <unordered_map>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/delta_rule.h"
#include "backend/cpu/simd.h"
#include "common/error.h"
#include "common/thread_pool.h"

namespace moeserve {
namespace {

// Sequences of at least this many new tokens take the chunked delta rule.
constexpr int64_t kChunkedDeltaRuleMinTokens = 16;

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with its default threshold of 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1) {
  ThreadPool::global().parallel_for(n, fn, grain);
}

// Rows of a weight matrix widened to float32. F32 rows are used in place; others are converted into a
// per-thread scratch buffer (and FP8 block scales applied).
class RowReader {
 public:
  explicit RowReader(const Matrix& w) : w_(w) {}
  const float* row(int64_t r, float* scratch) const {
    if (w_.dtype == DType::F32 && !w_.scale_inv) return static_cast<const float*>(w_.data) + r * w_.cols;
    if (w_.dtype == DType::BF16 && !w_.scale_inv) {
      cpu::bf16_to_f32(static_cast<const uint16_t*>(w_.data) + r * w_.cols, scratch, size_t(w_.cols));
      return scratch;
    }
    if (w_.dtype == DType::F8_E4M3 && w_.scale_inv) {
      const uint8_t* src = static_cast<const uint8_t*>(w_.data) + r * w_.cols;
      const float* scales = w_.scale_inv + (r / w_.block_rows) * w_.scale_cols();
      for (int64_t c = 0; c < w_.cols; c += w_.block_cols)
        cpu::fp8_e4m3_to_f32(src + c, scales[c / w_.block_cols], scratch + c,
                             size_t(std::min<int64_t>(w_.block_cols, w_.cols - c)));
      return scratch;
    }
    w_.row_f32(r, scratch);
    return scratch;
  }

 private:
  const Matrix& w_;
};

// One KV head's row of a layer's K or V pages as float32: used in place for a float32 pool, widened into the
// caller's head_dim scratch floats for bf16 and FP8 (the FP8 scale applied), so attention reads the stored
// bytes and never a widened copy of the cache.
class KvRowReader {
 public:
  KvRowReader(const KvCache& kv, int layer, bool keys)
      : kv_(kv), layer_(layer), keys_(keys), scale_(keys ? kv.k_scale(layer) : kv.v_scale(layer)) {}
  const float* head(int32_t page, int pos_in_page, int kv_head, float* scratch) const {
    const auto& s = kv_.spec();
    const auto* base =
        static_cast<const std::byte*>(keys_ ? kv_.key_data(layer_, page) : kv_.value_data(layer_, page));
    const int64_t element = int64_t(pos_in_page) * s.elements_per_row() + int64_t(kv_head) * s.head_dim;
    switch (s.dtype) {
      case DType::BF16:
        cpu::bf16_to_f32(reinterpret_cast<const uint16_t*>(base) + element, scratch, size_t(s.head_dim));
        return scratch;
      case DType::F8_E4M3:
        cpu::fp8_e4m3_to_f32(reinterpret_cast<const uint8_t*>(base) + element, scale_, scratch,
                             size_t(s.head_dim));
        return scratch;
      default:
        return reinterpret_cast<const float*>(base) + element;
    }
  }

 private:
  const KvCache& kv_;
  int layer_;
  bool keys_;
  float scale_;
};

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  ~CpuBackend() override {
    for (auto& [size, blocks] : free_blocks_)
      for (float* p : blocks) ::operator delete[](p, std::align_val_t(64));
  }

  Buffer allocate(size_t floats) override {
    // Sizes are rounded up to a power of two so freed blocks serve later requests of similar size.
    size_t size = std::bit_ceil(std::max<size_t>(floats, 16));
    {
      std::lock_guard lock(mutex_);
      auto& blocks = free_blocks_[size];
      if (!blocks.empty()) {
        float* p = blocks.back();
        blocks.pop_back();
        return Buffer(p, BufferDeleter{this, size});
      }
    }
    auto* p = static_cast<float*>(::operator new[](size * sizeof(float), std::align_val_t(64)));
    return Buffer(p, BufferDeleter{this, size});
  }

  void release(float* p, size_t floats) override {
    std::lock_guard lock(mutex_);
    free_blocks_[floats].push_back(p);
  }
  void fill_zero(float* x, size_t n) override { std::fill_n(x, n, 0.0f); }
  void copy(const float* src, float* dst, size_t n) override { std::copy_n(src, n, dst); }

  void matmul(const float* x, int64_t n, const Matrix& w, float* y) override {
    const int64_t M = w.rows, K = w.cols;
    constexpr int64_t kBlock = 4;  // weight rows per dot4: each x row is loaded once per four outputs
    const int64_t blocks = (M + kBlock - 1) / kBlock;
    RowReader reader(w);
    // Enough blocks per task that a task converts a few KB of weights, not one row.
    parallel_for(size_t(blocks), [&](size_t b0, size_t b1) {
      thread_local std::vector<float> scratch;
      scratch.resize(size_t(kBlock * K));
      for (size_t b = b0; b < b1; ++b) {
        const int64_t r0 = int64_t(b) * kBlock, rows = std::min(kBlock, M - r0);
        const float* rp[kBlock];
        for (int64_t i = 0; i < kBlock; ++i)
          rp[i] = i < rows ? reader.row(r0 + i, scratch.data() + i * K) : rp[0];
        float out[kBlock];
        for (int64_t t = 0; t < n; ++t) {
          cpu::dot4(x + t * K, rp[0], rp[1], rp[2], rp[3], size_t(K), out);
          std::copy_n(out, rows, y + t * M + r0);
        }
      }
    }, std::max<size_t>(1, size_t(16384 / std::max<int64_t>(K, 1))));
  }

  void embed(std::span<const int32_t> tokens, const Matrix& table, float* out) override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      check(tokens[i] >= 0 && tokens[i] < table.rows, "token id {} is outside the vocabulary (0..{})", tokens[i],
            table.rows - 1);
      table.row_f32(tokens[i], out + i * table.cols);
    }
  }

  void add(float* x, const float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, float eps,
                bool zero_centred, float* out, int64_t out_stride) override {
    parallel_for(size_t(rows), [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        const float* xr = x + r * x_stride;
        float* o = out + r * out_stride;
        float scale = 1.0f / std::sqrt(cpu::dot(xr, xr, size_t(dim)) / float(dim) + eps);
        for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * (zero_centred ? 1.0f + w[i] : w[i]);
      }
    }, 64);
  }

  void gated_rms_norm(const float* o, const float* z, int64_t rows, int64_t dim, const float* w, float eps,
                      float* out) override {
    parallel_for(size_t(rows), [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        const float* orow = o + r * dim;
        const float* zrow = z + r * dim;
        float scale = 1.0f / std::sqrt(cpu::dot(orow, orow, size_t(dim)) / float(dim) + eps);
        for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = w[i] * (orow[i] * scale) * silu(zrow[i]);
      }
    }, 64);
  }

  void rope(float* x, int64_t tokens, int heads, int head_dim, int rotary_dim, int64_t start_pos,
            const float* inv_freq) override {
    const int half = rotary_dim / 2;
    parallel_for(size_t(tokens), [&](size_t t0, size_t t1) {
      std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
      for (size_t t = t0; t < t1; ++t) {
        float pos = float(start_pos + int64_t(t));
        for (int i = 0; i < half; ++i) {
          float angle = pos * inv_freq[i];
          cos_v[i] = std::cos(angle);
          sin_v[i] = std::sin(angle);
        }
        for (int h = 0; h < heads; ++h) {
          float* v = x + (t * heads + h) * head_dim;
          for (int i = 0; i < half; ++i) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_v[i] - b * sin_v[i];
            v[i + half] = b * cos_v[i] + a * sin_v[i];
          }
        }
      }
    }, 16);
  }

  void paged_attention(const float* q, const float* k_new, const float* v_new, int64_t T, int heads,
                       int kv_heads, int head_dim, int64_t start_pos, std::span<const int32_t> pages, KvCache& kv,
                       int layer, float* out) override {
    const int page_size = kv.spec().page_size;
    const int64_t row_floats = int64_t(kv_heads) * head_dim;
    check(kv_heads == kv.spec().num_kv_heads && head_dim == kv.spec().head_dim,
          "attention: {} KV heads of {} on a cache of {} of {}", kv_heads, head_dim, kv.spec().num_kv_heads,
          kv.spec().head_dim);
    check(int64_t(pages.size()) * page_size >= start_pos + T, "attention: page table covers {} positions, need {}",
          pages.size() * page_size, start_pos + T);
    for (int64_t t = 0; t < T; ++t) {
      int64_t pos = start_pos + t;
      int32_t page = pages[size_t(pos / page_size)];
      kv.write_key_row(layer, page, int(pos % page_size), k_new + t * row_floats);
      kv.write_value_row(layer, page, int(pos % page_size), v_new + t * row_floats);
    }
    const int group = heads / kv_heads;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    const KvRowReader keys(kv, layer, true), values(kv, layer, false);
    parallel_for(size_t(T * heads), [&](size_t i0, size_t i1) {
      std::vector<float> scores, widened(static_cast<size_t>(head_dim));
      for (size_t i = i0; i < i1; ++i) {
        const int64_t t = int64_t(i) / heads;
        const int h = int(i % heads), kvh = h / group;
        const int64_t positions = start_pos + t + 1;
        const float* qv = q + (t * heads + h) * head_dim;
        scores.resize(size_t(positions));
        float max_score = -INFINITY;
        for (int64_t p = 0; p < positions; ++p) {
          const float* key = keys.head(pages[size_t(p / page_size)], int(p % page_size), kvh, widened.data());
          scores[p] = cpu::dot(qv, key, size_t(head_dim)) * scale;
          max_score = std::max(max_score, scores[p]);
        }
        float total = 0.0f;
        for (auto& s : scores) total += (s = std::exp(s - max_score));
        float* o = out + (t * heads + h) * head_dim;
        std::fill_n(o, head_dim, 0.0f);
        for (int64_t p = 0; p < positions; ++p) {
          const float* value =
              values.head(pages[size_t(p / page_size)], int(p % page_size), kvh, widened.data());
          cpu::axpy(scores[p] / total, value, o, size_t(head_dim));
        }
      }
    }, 4);
  }

  void mul_sigmoid(float* x, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= sigmoid(gate[r * gate_stride + i]);
  }

  void causal_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel, float* state,
                          float* out) override {
    const int history = kernel - 1;
    // Tokens outer, channels inner: x and out are token-major, so a block of channels is contiguous in both
    // (a channel-outer walk strided by the whole row, 32 KB at 8192 channels, for a handful of MACs each).
    // Each output sums j = 0..kernel-1 in order from 0, as the reference does.
    parallel_for(size_t(channels), [&](size_t c0, size_t c1) {
      const size_t n = c1 - c0;
      for (int64_t t = 0; t < T; ++t) {
        float* o = out + t * channels + int64_t(c0);
        std::fill_n(o, n, 0.0f);
        for (int j = 0; j < kernel; ++j) {
          const int64_t src = t + j - history;  // token of x; negative: a previous call's input, in the state
          const float* wj = w + c0 * size_t(kernel) + size_t(j);
          if (src >= 0) {
            const float* xs = x + src * channels + int64_t(c0);
            for (size_t i = 0; i < n; ++i) o[i] += wj[i * size_t(kernel)] * xs[i];
          } else {
            const float* ss = state + c0 * size_t(history) + size_t(history + src);
            for (size_t i = 0; i < n; ++i) o[i] += wj[i * size_t(kernel)] * ss[i * size_t(history)];
          }
        }
        for (size_t i = 0; i < n; ++i) o[i] = silu(o[i]);
      }
      // The new state is the last `history` inputs of [state, x]. Entry h takes window position T + h >= h,
      // so reading ascending never meets an entry already overwritten.
      for (size_t c = c0; c < c1; ++c) {
        float* sc = state + c * size_t(history);
        for (int h = 0; h < history; ++h) {
          const int64_t p = T + h;
          sc[h] = p < history ? sc[p] : x[(p - history) * channels + int64_t(c)];
        }
      }
    }, 256);
  }

  void gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T, int v_heads,
                 float* beta, float* g) override {
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < v_heads; ++h) {
        int64_t i = t * v_heads + h;
        beta[i] = sigmoid(b[i]);
        g[i] = -std::exp(a_log[h]) * softplus(a[i] + dt_bias[h]);
      }
  }

  void gated_delta_rule(const DeltaRuleShape& s, const float* q, const float* k, int64_t qk_stride, const float* v,
                        int64_t v_stride, const float* g, const float* beta, int64_t T, float* state,
                        float* out) override {
    const int dk = s.k_dim, dv = s.v_dim, ratio = s.v_heads / s.k_heads;
    // l2-normalised q (also scaled by 1/sqrt(dk)) and k for every token and key head.
    std::vector<float> qn(static_cast<size_t>(T * s.k_heads * dk)), kn(qn.size());
    const float q_scale = 1.0f / std::sqrt(float(dk));
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < s.k_heads; ++h) {
        const float* qs = q + t * qk_stride + int64_t(h) * dk;
        const float* ks = k + t * qk_stride + int64_t(h) * dk;
        float* qd = qn.data() + (t * s.k_heads + h) * dk;
        float* kd = kn.data() + (t * s.k_heads + h) * dk;
        float qi = 1.0f / std::sqrt(cpu::dot(qs, qs, size_t(dk)) + 1e-6f);
        float ki = 1.0f / std::sqrt(cpu::dot(ks, ks, size_t(dk)) + 1e-6f);
        for (int i = 0; i < dk; ++i) {
          qd[i] = qs[i] * qi * q_scale;
          kd[i] = ks[i] * ki;
        }
      }
    // Prefill chunks use the chunked (WY) form, decode steps the recurrence: the same split as HF.
    const bool chunked = T >= kChunkedDeltaRuleMinTokens;
    parallel_for(size_t(s.v_heads), [&](size_t h0, size_t h1) {
      for (size_t h = h0; h < h1; ++h) {
        const int64_t kh = int64_t(h) / ratio;
        cpu::DeltaRuleHead head{qn.data() + kh * dk, kn.data() + kh * dk, int64_t(s.k_heads) * dk,
                                v + int64_t(h) * dv, v_stride, g + h, beta + h, s.v_heads,
                                out + int64_t(h) * dv, int64_t(s.v_heads) * dv};
        float* S = state + h * dk * dv;
        if (chunked) cpu::delta_rule_chunked(head, T, dk, dv, S);
        else cpu::delta_rule_recurrent(head, T, dk, dv, S);
      }
    });
  }

  void swiglu(const SwiGlu& w, const float* x, int64_t n, float* out) override {
    const size_t m = size_t(n * w.gate.rows);
    auto gate = allocate(m), up = allocate(m);
    matmul(x, n, w.gate, gate.get());
    matmul(x, n, w.up, up.get());
    for (size_t i = 0; i < m; ++i) gate[i] = silu(gate[i]) * up[i];
    matmul(gate.get(), n, w.down, out);
  }

  void moe_experts(std::span<const SwiGlu> experts, const float* router_logits, int top_k, bool renormalize,
                   const float* x, int64_t n, int64_t hidden, float* out) override {
    const int E = int(experts.size());
    // Route: per token, the top-k experts of softmax(logits) and their (renormalised) weights.
    std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(E));  // expert -> (token, weight)
    std::vector<float> probs(static_cast<size_t>(E));
    std::vector<int> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < n; ++t) {
      const float* logits = router_logits + t * E;
      float max_logit = *std::max_element(logits, logits + E), total = 0.0f;
      for (int e = 0; e < E; ++e) total += (probs[e] = std::exp(logits[e] - max_logit));
      for (auto& p : probs) p /= total;
      for (int e = 0; e < E; ++e) order[e] = e;
      // Highest probability first; equal probabilities keep the lower expert id first, as torch.topk does.
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                        [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
      float chosen = 0.0f;
      for (int i = 0; i < top_k; ++i) chosen += probs[order[i]];
      for (int i = 0; i < top_k; ++i)
        assigned[order[i]].emplace_back(t, renormalize ? probs[order[i]] / chosen : probs[order[i]]);
    }
    std::fill_n(out, n * hidden, 0.0f);
    for (int e = 0; e < E; ++e) {
      const auto& rows = assigned[e];
      if (rows.empty()) continue;
      const int64_t m = int64_t(rows.size());
      auto xs = allocate(size_t(m * hidden)), ys = allocate(size_t(m * hidden));
      for (int64_t i = 0; i < m; ++i) std::copy_n(x + rows[i].first * hidden, hidden, xs.get() + i * hidden);
      swiglu(experts[e], xs.get(), m, ys.get());
      for (int64_t i = 0; i < m; ++i)
        cpu::axpy(rows[i].second, ys.get() + i * hidden, out + rows[i].first * hidden, size_t(hidden));
    }
  }

  void add_sigmoid_gated(float* out, const float* y, const float* gate_logit, int64_t rows, int64_t dim) override {
    for (int64_t r = 0; r < rows; ++r) cpu::axpy(sigmoid(gate_logit[r]), y + r * dim, out + r * dim, size_t(dim));
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<float*>> free_blocks_;  // size (floats) -> free blocks
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace moeserve
