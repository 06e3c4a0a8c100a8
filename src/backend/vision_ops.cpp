// The vision tower's ops as host code over download/upload: the CPU reference, and what any backend runs
// until it has kernels of its own (on the CPU the transfers are copies).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"
#include "common/thread_pool.h"

namespace moeserve {
namespace {

std::vector<float> fetch(Backend& b, const float* x, size_t n) {
  std::vector<float> host(n);
  b.download(x, host.data(), n);
  return host;
}

}  // namespace

void Backend::add_bias(float* x, const float* bias, int64_t rows, int64_t dim) {
  std::vector<float> h = fetch(*this, x, size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) h[size_t(r * dim + c)] += bias[c];
  upload(h.data(), x, h.size());
}

void Backend::layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                         float* out) {
  std::vector<float> h = fetch(*this, x, size_t(rows * dim));
  ThreadPool::global().parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      float* row = &h[r * size_t(dim)];
      double sum = 0, sq = 0;
      for (int64_t c = 0; c < dim; ++c) sum += row[c];
      const double mean = sum / double(dim);
      for (int64_t c = 0; c < dim; ++c) sq += (row[c] - mean) * (row[c] - mean);
      const float m = float(mean), inv = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
      for (int64_t c = 0; c < dim; ++c) row[c] = (row[c] - m) * inv * w[c] + b[c];
    }
  });
  upload(h.data(), out, h.size());
}

void Backend::gelu(float* x, size_t n, bool tanh_approx) {
  std::vector<float> h = fetch(*this, x, n);
  const float k = std::sqrt(2.0f / float(M_PI));
  for (float& v : h)
    v = tanh_approx ? 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)))
                    : 0.5f * v * (1.0f + std::erf(v * float(M_SQRT1_2)));
  upload(h.data(), x, n);
}

void Backend::rope_table(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, int rotary_dim,
                         const float* cos, const float* sin) {
  check(rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rope_table: rotary_dim {} of head_dim {}", rotary_dim,
        head_dim);
  if (rows == 0) return;
  const int half = rotary_dim / 2;
  const size_t span = size_t((rows - 1) * row_stride + int64_t(heads) * head_dim);
  std::vector<float> h = fetch(*this, x, span), hc = fetch(*this, cos, size_t(rows * half)),
                     hs = fetch(*this, sin, size_t(rows * half));
  for (int64_t r = 0; r < rows; ++r)
    for (int hd = 0; hd < heads; ++hd) {
      float* v = &h[size_t(r * row_stride + int64_t(hd) * head_dim)];
      for (int j = 0; j < half; ++j) {
        const float c = hc[size_t(r * half + j)], s = hs[size_t(r * half + j)], a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
      }
    }
  upload(h.data(), x, span);
}

void Backend::segment_attention(const float* q, const float* k, const float* v, int64_t stride, int heads,
                                int head_dim, std::span<const int64_t> starts, float* out) {
  check(starts.size() >= 2 && starts.front() == 0, "segment_attention: segment starts must begin at 0");
  const int64_t rows = starts.back(), width = int64_t(heads) * head_dim;
  // Up to the last row's end: q, k and v may be column ranges of one interleaved buffer.
  const size_t span = rows > 0 ? size_t((rows - 1) * stride + width) : 0;
  std::vector<float> hq = fetch(*this, q, span), hk = fetch(*this, k, span), hv = fetch(*this, v, span),
                     ho(size_t(rows * width));
  const float scale = 1.0f / std::sqrt(float(head_dim));
  // One work item per (segment, head, query row): every row's softmax is independent.
  std::vector<int64_t> segment_of(static_cast<size_t>(rows));
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    check(starts[s] <= starts[s + 1], "segment_attention: segment starts must not decrease");
    for (int64_t r = starts[s]; r < starts[s + 1]; ++r) segment_of[size_t(r)] = int64_t(s);
  }
  ThreadPool::global().parallel_for(size_t(rows) * size_t(heads), [&](size_t begin, size_t end) {
    std::vector<float> scores;
    for (size_t item = begin; item < end; ++item) {
      const int64_t r = int64_t(item) / heads;
      const int h = int(int64_t(item) % heads);
      const int64_t s = segment_of[size_t(r)], lo = starts[size_t(s)], hi = starts[size_t(s) + 1];
      const float* qr = &hq[size_t(r * stride + int64_t(h) * head_dim)];
      scores.assign(size_t(hi - lo), 0.0f);
      float mx = -INFINITY;
      for (int64_t j = lo; j < hi; ++j) {
        const float* kr = &hk[size_t(j * stride + int64_t(h) * head_dim)];
        float dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += qr[d] * kr[d];
        mx = std::max(mx, scores[size_t(j - lo)] = dot * scale);
      }
      double total = 0;
      for (float& sc : scores) total += sc = std::exp(sc - mx);
      float* o = &ho[size_t(r * width + int64_t(h) * head_dim)];
      for (int64_t j = lo; j < hi; ++j) {
        const float p = float(scores[size_t(j - lo)] / total);
        const float* vr = &hv[size_t(j * stride + int64_t(h) * head_dim)];
        for (int d = 0; d < head_dim; ++d) o[d] += p * vr[d];
      }
    }
  });
  upload(ho.data(), out, ho.size());
}

}  // namespace moeserve
