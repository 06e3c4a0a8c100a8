// The fixture checkpoints (tests/fixtures/models) on the CUDA backend against their Hugging Face references:
// the logits of every prompt position and greedy generation through the caches (decode steps replayed as CUDA
// graphs). With float32 matmuls the GPU must meet the CPU's tolerance (1e-3 max |Δlogit|). With the bf16
// tensor-core matmuls (prefill) the greedy tokens must match and the median position's logits stay within 2%
// of the largest logit: bf16 keeps 8 significant bits (2^-9 relative per rounding), a few roundings per
// layer. The maximum over positions is reported but not bounded: a perturbation that swaps two near-tied
// experts in a token's top-k moves that token's MoE output by a whole expert's contribution, so single
// positions can differ by O(0.1-1) while the rest agree to rounding.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/checkpoint.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "model/sequence.h"

namespace moeserve {
namespace {

std::vector<int32_t> ids_of(const TensorSet& ref, const std::string& name) {
  const TensorInfo* t = ref.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<int32_t> ids(size_t(t->numel()));
  const auto* src = reinterpret_cast<const int64_t*>(t->data);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(src[i]);
  return ids;
}

const float* floats_of(const TensorSet& ref, const std::string& name) {
  const TensorInfo* t = ref.find(name);
  return t ? reinterpret_cast<const float*>(t->data) : nullptr;
}

double max_abs(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, std::isnan(a[i]) ? INFINITY : double(std::fabs(a[i] - b[i])));
  return m;
}
// Per row of `cols`: max |a - b|; then the median over rows.
double median_row_error(const float* a, const float* b, size_t rows, size_t cols) {
  std::vector<double> e(rows);
  for (size_t r = 0; r < rows; ++r) e[r] = max_abs(a + r * cols, b + r * cols, cols);
  std::nth_element(e.begin(), e.begin() + long(rows / 2), e.end());
  return e[rows / 2];
}
double max_magnitude(const float* a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

class CudaFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFixtures, MatchesHuggingFaceReference) {
  MOESERVE_REQUIRE_GPU();
  const std::string dir = "tests/fixtures/models/" + GetParam();
  auto weights = load_checkpoint(dir);
  // As `moeserve verify` does: a bf16 checkpoint's reference ran with bf16-rounded RoPE frequencies.
  weights.config.rope_bf16_inv_freq = weights.config.dtype == "bfloat16" && !weights.config.fp8;
  auto reference = TensorSet::open_file(dir + "/reference.safetensors");
  const int64_t V = weights.config.vocab_size;
  for (bool fp32 : {true, false}) {
    auto gpu = make_backend("cuda", {.fp32_matmul = fp32});
    Qwen35Model model(weights, *gpu);
    // bf16: relative to the largest logit (a bf16 rounding is 2^-9 relative; a few dozen roundings per layer
    // compound to about a percent).
    const double tol = fp32 ? 1e-3 : 2e-2;
    const char* mode = fp32 ? "fp32 matmuls" : "bf16 matmuls";
    for (int i = 0; reference.find(fmt::format("prompt{}.input_ids", i)); ++i) {
      auto ids = ids_of(reference, fmt::format("prompt{}.input_ids", i));
      SequenceRunner runner(model, int64_t(ids.size()));
      auto out = runner.prefill(ids, true);
      const float* expected = floats_of(reference, fmt::format("prompt{}.logits", i));
      ASSERT_NE(expected, nullptr);
      const double err = max_abs(out.logits.data(), expected, out.logits.size());
      const double median = median_row_error(out.logits.data(), expected, ids.size(), size_t(V));
      const double scale = max_magnitude(expected, out.logits.size());
      std::printf("%s\n",
                  fmt::format("{:<22} prompt{} {:>4} tokens  {}  max|Δlogit| {:.3e}  median over positions "
                              "{:.3e}  (max|logit| {:.2f})",
                              GetParam(), i, ids.size(), mode, err, median, scale)
                      .c_str());
      if (fp32)
        EXPECT_LE(err, tol) << GetParam() << " prompt" << i << " " << mode;
      else
        EXPECT_LE(median, tol * std::max(1.0, scale)) << GetParam() << " prompt" << i << " " << mode;
    }
    for (int i = 0; reference.find(fmt::format("gen{}.input_ids", i)); ++i) {
      auto prompt = ids_of(reference, fmt::format("gen{}.input_ids", i));
      auto expected_ids = ids_of(reference, fmt::format("gen{}.output_ids", i));
      const float* scores = floats_of(reference, fmt::format("gen{}.scores", i));
      ASSERT_NE(scores, nullptr);
      SequenceRunner runner(model, int64_t(prompt.size() + expected_ids.size()));
      std::vector<std::vector<float>> step_logits;
      auto got = runner.generate_greedy(prompt, int(expected_ids.size()), {}, &step_logits);
      double err = 0;
      for (size_t s = 0; s < step_logits.size(); ++s)
        err = std::max(err, max_abs(step_logits[s].data(), scores + s * V, size_t(V)));
      std::vector<float> flat;
      for (const auto& l : step_logits) flat.insert(flat.end(), l.begin(), l.end());
      const double median = median_row_error(flat.data(), scores, step_logits.size(), size_t(V));
      std::printf("%s\n",
                  fmt::format("{:<22} gen{}    {:>4} steps   {}  max|Δlogit| {:.3e}  median over steps "
                              "{:.3e}  tokens {}",
                              GetParam(), i, expected_ids.size(), mode, err, median,
                              got == expected_ids ? "match" : "DIFFER")
                      .c_str());
      EXPECT_EQ(got, expected_ids) << GetParam() << " gen" << i << " " << mode;
      if (fp32)
        EXPECT_LE(err, tol) << GetParam() << " gen" << i << " " << mode;
      else
        EXPECT_LE(median, tol * std::max(1.0, max_magnitude(scores, expected_ids.size() * size_t(V))))
            << GetParam() << " gen" << i << " " << mode;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaFixtures,
                         ::testing::Values("tiny-dense", "tiny-moe", "tiny-moe-vl-layout",
                                           "small-moe-realdims", "small-moe-realdims-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace moeserve
