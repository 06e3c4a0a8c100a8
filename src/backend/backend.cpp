#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/error.h"

#ifdef MOESERVE_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {

void Backend::argmax(const float* x, int64_t rows, int64_t cols, int32_t* out_host) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    download(x + r * cols, row.data(), size_t(cols));
    out_host[r] = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  }
}

void Backend::logits_topk(const float* x, int64_t rows, int64_t cols, std::span<const float> temperatures,
                          int k, float* out) {
  check(k >= 1 && k <= kMaxLogitsTopk && int64_t(temperatures.size()) == rows,
        "logits_topk: k {} (1..{}), {} temperatures for {} rows", k, kMaxLogitsTopk, temperatures.size(),
        rows);
  const int64_t stride = logits_topk_record_floats(k);
  std::vector<float> row(static_cast<size_t>(cols)), record(static_cast<size_t>(stride));
  std::vector<int32_t> idx(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    download(x + r * cols, row.data(), size_t(cols));
    LogitsTopkHeader h{};
    h.max = *std::max_element(row.begin(), row.end());
    const double inv_t = 1.0 / double(temperatures[size_t(r)]);
    for (float l : row) {
      h.sum_exp += std::exp(double(l - h.max));
      h.sum_exp_t += std::exp(double(l - h.max) * inv_t);
    }
    h.count = int32_t(std::min<int64_t>(k, cols));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + h.count, idx.end(), [&](int32_t a, int32_t b) {
      return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
    });
    std::fill(record.begin(), record.end(), 0.0f);
    std::memcpy(record.data(), &h, sizeof(h));
    float* values = record.data() + sizeof(h) / sizeof(float);
    for (int32_t i = 0; i < h.count; ++i) {
      values[i] = row[size_t(idx[size_t(i)])];
      std::memcpy(values + k + i, &idx[size_t(i)], sizeof(int32_t));
    }
    upload(record.data(), out + r * stride, size_t(stride));
  }
}

void Backend::matmul_n(const float* x, int64_t n, std::span<const Matrix* const> ws,
                       std::span<float* const> ys) {
  check(ws.size() == ys.size(), "matmul_n: {} matrices but {} outputs", ws.size(), ys.size());
  for (size_t i = 0; i < ws.size(); ++i) matmul(x, n, *ws[i], ys[i]);
}

void Backend::gdn_decode(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b,
                         const float* a, int64_t n, const float* conv_w, int kernel, const float* a_log,
                         const float* dt_bias, const float* norm_w, float eps,
                         std::span<float* const> conv_states, std::span<float* const> states, float* out) {
  check(int64_t(conv_states.size()) == n && int64_t(states.size()) == n,
        "gdn_decode: {} sequences, {} states", n, states.size());
  const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, value_dim = int64_t(s.v_heads) * s.v_dim;
  const int64_t C = 2 * key_dim + value_dim;
  auto conv = allocate(size_t(n * C)), core = allocate(size_t(n * value_dim));
  auto beta = allocate(size_t(n * s.v_heads)), g = allocate(size_t(n * s.v_heads));
  gdn_gates(b, a, a_log, dt_bias, n, s.v_heads, beta.get(), g.get());
  for (int64_t i = 0; i < n; ++i) {
    float* row = conv.get() + i * C;
    causal_conv1d_silu(qkv + i * C, 1, C, conv_w, kernel, conv_states[size_t(i)], row);
    gated_delta_rule(s, row, row + key_dim, C, row + 2 * key_dim, C, g.get() + i * s.v_heads,
                     beta.get() + i * s.v_heads, 1, states[size_t(i)], core.get() + i * value_dim);
  }
  gated_rms_norm(core.get(), z, n * s.v_heads, s.v_dim, norm_w, eps, out);
}

void Backend::gdn_verify(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b,
                         const float* a, std::span<const int64_t> first_rows,
                         std::span<const int64_t> lengths, const float* conv_w, int kernel,
                         const float* a_log, const float* dt_bias, const float* norm_w, float eps,
                         std::span<float* const> conv_states, std::span<float* const> states,
                         std::span<float* const> conv_trails, std::span<float* const> trails, float* out) {
  const size_t n = first_rows.size();
  check(lengths.size() == n && conv_states.size() == n && states.size() == n,
        "gdn_verify: {} sequences, {} lengths, {} states", n, lengths.size(), states.size());
  int64_t trail_count = 0;
  for (int64_t T : lengths) {
    check(T >= 1, "gdn_verify: a sequence of {} tokens", T);
    trail_count += T - 1;
  }
  check(int64_t(conv_trails.size()) == trail_count && int64_t(trails.size()) == trail_count,
        "gdn_verify: {} trail states for {} tokens after the first", trails.size(), trail_count);
  const int64_t key_dim = int64_t(s.k_heads) * s.k_dim, value_dim = int64_t(s.v_heads) * s.v_dim;
  const int64_t C = 2 * key_dim + value_dim;
  const size_t conv_n = size_t(C * (kernel - 1)), rec_n = size_t(s.v_heads) * s.k_dim * s.v_dim;
  size_t trail = 0;
  for (size_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < lengths[i]; ++t) {
      const int64_t r = first_rows[i] + t;
      gdn_decode(s, qkv + r * C, z + r * value_dim, b + r * s.v_heads, a + r * s.v_heads, 1, conv_w, kernel,
                 a_log, dt_bias, norm_w, eps, {&conv_states[i], 1}, {&states[i], 1}, out + r * value_dim);
      if (t + 1 == lengths[i]) continue;
      copy(conv_states[i], conv_trails[trail], conv_n);
      copy(states[i], trails[trail], rec_n);
      ++trail;
    }
}

void Backend::attention_decode(const float* qg, float* k, const float* v, int64_t n, int heads, int kv_heads,
                               int head_dim, const float* q_norm, const float* k_norm, float eps,
                               int rotary_dim, const float* inv_freq, std::span<const int64_t> positions,
                               std::span<const int64_t> rope_offsets,
                               std::span<const std::span<const int32_t>> pages, KvCache& kv, int layer,
                               float* out) {
  check(int64_t(positions.size()) == n && int64_t(pages.size()) == n,
        "attention_decode: {} sequences, {} tables", n, pages.size());
  check(rope_offsets.empty() || int64_t(rope_offsets.size()) == n,
        "attention_decode: {} sequences, {} offsets", n, rope_offsets.size());
  const int64_t hd = head_dim;
  auto q = allocate(size_t(n * heads * hd));
  rms_norm(qg, n * heads, hd, 2 * hd, q_norm, eps, true, q.get(), hd);
  rms_norm(k, n * kv_heads, hd, hd, k_norm, eps, true, k, hd);
  for (int64_t i = 0; i < n; ++i) {
    float* qs = q.get() + i * heads * hd;
    float* ks = k + i * kv_heads * hd;
    const int64_t rope_pos = positions[size_t(i)] + (rope_offsets.empty() ? 0 : rope_offsets[size_t(i)]);
    rope(qs, 1, heads, head_dim, rotary_dim, rope_pos, inv_freq);
    rope(ks, 1, kv_heads, head_dim, rotary_dim, rope_pos, inv_freq);
    paged_attention(qs, ks, v + i * kv_heads * hd, 1, heads, kv_heads, head_dim, positions[size_t(i)],
                    pages[size_t(i)], kv, layer, out + i * heads * hd);
  }
}

void Backend::moe_block(const Matrix& router, std::span<const SwiGlu> experts, int top_k, bool renormalize,
                        const SwiGlu* shared, const Matrix* shared_gate, const float* x, int64_t n,
                        int64_t hidden, float* out) {
  auto logits = allocate(size_t(n * router.rows));
  matmul(x, n, router, logits.get());
  moe_experts(experts, logits.get(), top_k, renormalize, x, n, hidden, out);
  if (!shared) return;
  check(shared_gate != nullptr, "moe: a shared expert without its gate");
  auto y = allocate(size_t(n * hidden)), gate = allocate(size_t(n));
  swiglu(*shared, x, n, y.get());
  matmul(x, n, *shared_gate, gate.get());
  add_sigmoid_gated(out, y.get(), gate.get(), n, hidden);
}

std::unique_ptr<Backend> make_backend(std::string_view device, const BackendOptions& options) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef MOESERVE_HAS_CUDA
    return make_cuda_backend(options);
#else
    (void)options;
    fail("this moeserve was built without CUDA (configure with -DMOESERVE_CUDA=ON)");
#endif
  }
  fail("unknown device '{}' (expected cpu or cuda)", device);
}

bool cuda_available() {
#ifdef MOESERVE_HAS_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moeserve
