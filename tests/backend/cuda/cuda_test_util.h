#pragma once
// Helpers for the CUDA backend tests: skipping without a GPU, the CUDA-against-CPU fixture and its
// tolerances, device copies of host data, weights of every dtype kept alive for a whole test (the backend
// keys its device copies by host address), and error norms.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <deque>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "common/dtype.h"
#include "naive.h"

namespace moeserve::testing {

#define MOESERVE_REQUIRE_GPU()                                                               \
  do {                                                                                       \
    if (!::moeserve::cuda_available())                                                       \
      GTEST_SKIP() << "no CUDA device visible: the CUDA backend tests run on a GPU machine"; \
  } while (0)

// max |a - b| / max(1, max |b|); NaN anywhere (an unwritten, poisoned output) gives infinity.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double scale = 1, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    scale = std::max(scale, double(std::abs(b[i])));
    err = std::max(err, double(std::abs(a[i] - b[i])));
  }
  return err / scale;
}

// Tolerances of rel_error: float32 kernels agree with the CPU to summation order (1e-5..1e-4 of the output's
// scale); bf16 tensor-core paths round their operands to bf16 (2^-9 relative each).
constexpr double kExact = 2e-5;
constexpr double kBf16 = 2e-2;

// A suite comparing the CUDA backend, as served (bf16 tensor-core matmuls) and with float32 matmuls, with the
// CPU backend (the reference); skipped without a GPU.
class CudaAgainstCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    MOESERVE_REQUIRE_GPU();
    gpu = make_backend("cuda");
    gpu32 = make_backend("cuda", {.fp32_matmul = true});
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu, gpu32;
};

// Device buffer holding a copy of host data (poisoned with NaN when made from a size only).
inline Buffer to_device(Backend& be, const std::vector<float>& host) {
  auto b = be.allocate(host.size());
  be.upload(host.data(), b.get(), host.size());
  return b;
}
inline Buffer poisoned(Backend& be, size_t n) {
  return to_device(be, std::vector<float>(n, NAN));
}
inline std::vector<float> to_host(Backend& be, const float* d, size_t n) {
  std::vector<float> h(n);
  be.download(d, h.data(), n);
  return h;
}

// Weight matrices of any dtype whose storage lives as long as the store.
class WeightStore {
 public:
  // Random values uniform with standard deviation `scale` (a fast generator: the 35B shapes hold 10^9
  // values); FP8 gets 128x128 block scales.
  Matrix make(DType dtype, int64_t rows, int64_t cols, uint32_t seed, float scale = 0.2f) {
    std::vector<float> raw(size_t(rows * cols));
    uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (auto& v : raw) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      v = (float(state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale * 1.7320508f;
    }
    auto& bytes = storage_.emplace_back(size_t(rows * cols) * dtype_size(dtype));
    Matrix m{dtype, rows, cols, bytes.data()};
    for (size_t i = 0; i < raw.size(); ++i) {
      switch (dtype) {
        case DType::F32:
          reinterpret_cast<float*>(bytes.data())[i] = raw[i];
          break;
        case DType::F16:
          reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_f16(raw[i]);
          break;
        case DType::BF16:
          reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(raw[i]);
          break;
        case DType::F8_E4M3: {
          // A random code with exponent 4..8 (magnitudes 0.125..3.75): quicker than rounding a float.
          const uint32_t bits = std::bit_cast<uint32_t>(raw[i]);
          bytes[i] = uint8_t((raw[i] < 0 ? 0x80 : 0) | ((4 + bits % 5) << 3) | ((bits >> 8) & 7));
          break;
        }
        default:
          break;
      }
    }
    if (dtype == DType::F8_E4M3) {
      m.block_rows = m.block_cols = 128;
      const size_t blocks = size_t((rows + 127) / 128 * m.scale_cols());
      auto s = random_vector(blocks, seed + 7, 1.0f);
      auto& scales = scales_.emplace_back(blocks);
      for (size_t i = 0; i < blocks; ++i) scales[i] = scale * 0.5f * (0.5f + std::abs(s[i]));
      m.scale_inv = scales.data();
    }
    return m;
  }

  // An FP8 matrix whose element (r, c) is the e4m3 code code(r, c), every 128x128 block scaled by 1.
  template <typename Code>
  Matrix make_fp8_codes(int64_t rows, int64_t cols, Code code) {
    auto& bytes = storage_.emplace_back(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) bytes[size_t(r * cols + c)] = code(r, c);
    Matrix m{DType::F8_E4M3, rows, cols, bytes.data()};
    m.block_rows = m.block_cols = 128;
    m.scale_inv = scales_.emplace_back(size_t((rows + 127) / 128 * m.scale_cols()), 1.0f).data();
    return m;
  }

 private:
  std::deque<std::vector<uint8_t>> storage_;
  std::deque<std::vector<float>> scales_;
};

}  // namespace moeserve::testing
