// The vision tower on the CUDA backend: its five ops (add_bias, layer_norm, gelu, rope_table,
// segment_attention) against the CPU backend, outputs poisoned with NaN first, at the fixture's shapes and
// the 35B-A3B tower's (hidden 1152, 16 heads of 72); then the whole image path of tiny-moe-vl-image against
// its Hugging Face reference, as `moeserve verify --device cuda` runs it.
//
// Tolerances (relative to max(1, the reference's largest magnitude), testing::rel_error):
//  - float32 kernels agree with the CPU to summation order and libm-vs-CUDA rounding of erf/tanh/exp: 2e-5;
//  - bf16 tensor-core attention rounds q, k, v and the softmax weights to bf16 (2^-9 relative each); over
//    N(0, 1) inputs that moves an output by a few 1e-3 of the largest, so 2e-2 leaves 4x room, while a key
//    masked wrongly or a tile dropped moves outputs by O(0.1).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <tuple>

#include "cuda_test_util.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "vision/verify_vision.h"

namespace moeserve {
namespace {

using namespace testing;  // moeserve::testing: cuda_test_util.h

class CudaVisionOps : public CudaAgainstCpu {
 protected:
  std::deque<std::vector<float>> keep;  // host weight vectors outlive the backends' device copies
};

TEST_F(CudaVisionOps, BiasLayerNormGeluAndRopeTable) {
  for (int64_t dim : {64, 1152, 4304}) {
    SCOPED_TRACE(fmt::format("dim {}", dim));
    const int64_t rows = 37;
    auto x = random_vector(size_t(rows * dim), uint32_t(dim), 2.0f);
    for (int64_t c = 0; c < dim; ++c) x[size_t(c)] += 5.0f;  // a row far from zero mean
    auto& bias = keep.emplace_back(random_vector(size_t(dim), uint32_t(dim + 1), 0.1f));
    auto& w = keep.emplace_back(random_vector(size_t(dim), uint32_t(dim + 2), 0.2f));
    auto& b = keep.emplace_back(random_vector(size_t(dim), uint32_t(dim + 3), 0.1f));
    for (auto& v : w) v += 1.0f;

    auto ref = x;
    cpu->add_bias(ref.data(), bias.data(), rows, dim);
    auto xd = to_device(*gpu, x);
    gpu->add_bias(xd.get(), bias.data(), rows, dim);
    EXPECT_LT(rel_error(to_host(*gpu, xd.get(), x.size()), ref), kExact) << "add_bias";

    std::vector<float> normed(x.size());
    cpu->layer_norm(x.data(), rows, dim, w.data(), b.data(), 1e-6f, normed.data());
    xd = to_device(*gpu, x);
    auto out = poisoned(*gpu, x.size());
    gpu->layer_norm(xd.get(), rows, dim, w.data(), b.data(), 1e-6f, out.get());
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), x.size()), normed), kExact) << "layer_norm";

    for (bool tanh_approx : {true, false}) {
      auto g = x;
      cpu->gelu(g.data(), g.size(), tanh_approx);
      xd = to_device(*gpu, x);
      gpu->gelu(xd.get(), x.size(), tanh_approx);
      EXPECT_LT(rel_error(to_host(*gpu, xd.get(), x.size()), g), kExact) << "gelu tanh " << tanh_approx;
    }
  }
  // rope_table on the q part of interleaved [q | k | v] rows (the tower's layout): k and v stay as they were.
  for (auto [heads, hd, rot] : {std::tuple{2, 32, 32}, {16, 72, 72}, {4, 64, 16}}) {
    SCOPED_TRACE(fmt::format("{} heads of {}, rotary {}", heads, hd, rot));
    const int64_t rows = 45, width = int64_t(heads) * hd, stride = 3 * width;
    auto x = random_vector(size_t(rows * stride), uint32_t(hd + rot));
    auto cos = random_vector(size_t(rows * rot / 2), 5), sin = random_vector(size_t(rows * rot / 2), 6);
    auto ref = x;
    cpu->rope_table(ref.data(), rows, stride, heads, hd, rot, cos.data(), sin.data());
    auto xd = to_device(*gpu, x), cd = to_device(*gpu, cos), sd = to_device(*gpu, sin);
    gpu->rope_table(xd.get(), rows, stride, heads, hd, rot, cd.get(), sd.get());
    EXPECT_LT(rel_error(to_host(*gpu, xd.get(), x.size()), ref), kExact);
  }
}

TEST_F(CudaVisionOps, SegmentAttentionWithinEachImage) {
  struct Case {
    int heads, hd;
    std::vector<int64_t> starts;
  };
  // Segments of 1 row, exactly one 64-row tile, one past it, and several tiles with a partial last one;
  // head dims of the fixture (32), the release tower (72, padded to 80 for the tensor cores), one that pads
  // to 48, and one past the tensor-core kernel's 128 (float32 on both backends).
  const std::vector<Case> cases = {
      {2, 32, {0, 1, 65, 130, 330}},
      {16, 72, {0, 200, 264, 265}},
      {3, 40, {0, 7, 100}},
      {2, 160, {0, 50, 51, 120}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} heads of {}", c.heads, c.hd));
    const int64_t rows = c.starts.back(), width = int64_t(c.heads) * c.hd, stride = 3 * width;
    auto qkv = random_vector(size_t(rows * stride), uint32_t(c.hd + rows));
    std::vector<float> ref(size_t(rows * width));
    cpu->segment_attention(qkv.data(), qkv.data() + width, qkv.data() + 2 * width, stride, c.heads, c.hd,
                           c.starts, ref.data());
    for (Backend* be : {gpu32.get(), gpu.get()}) {
      const bool tensor_cores = be == gpu.get() && c.hd <= 128;
      auto xd = to_device(*be, qkv);
      auto out = poisoned(*be, ref.size());
      be->segment_attention(xd.get(), xd.get() + width, xd.get() + 2 * width, stride, c.heads, c.hd, c.starts,
                            out.get());
      EXPECT_LT(rel_error(to_host(*be, out.get(), ref.size()), ref), tensor_cores ? kBf16 : kExact)
          << (tensor_cores ? "tensor cores" : "float32");
    }
  }
}

// The image path of the vision fixture on the GPU, every stage `moeserve verify` prints. Float32 matmuls
// (and float32 attention): 2e-3 absolute, twice the CPU's bound: the prompt logits in chunks of 16 measured
// 1.01e-3 on the H200 (the reference's own reload noise is 3.1e-4, the CPU's error 5.4e-4; the rest is
// summation order). bf16 (the serving precision: the tower's attention on tensor cores): 2e-2 of each
// stage's largest reference magnitude (a few bf16 roundings of 2^-9 per layer compound to ~1%; the logits
// reach ~5, so 0.1 absolute) with the prompt logits bounded at the median position (a near-tie in the top-k
// routing swaps at single positions: 0.75 there), and the greedy tokens identical. docs/cuda.md.
TEST(CudaVision, ImagePathMatchesHuggingFaceReference) {
  MOESERVE_REQUIRE_GPU();
  const std::string dir = "tests/fixtures/models/tiny-moe-vl-image";
  auto checkpoint = open_checkpoint(dir);
  auto reference = TensorSet::open_file(dir + "/reference.safetensors");
  auto vision = load_vision_weights(checkpoint.tensors, *VisionConfig::from_dir(dir));
  for (bool fp32 : {true, false}) {
    const char* mode = fp32 ? "fp32 matmuls" : "bf16 matmuls";
    auto gpu = make_backend("cuda", {.fp32_matmul = fp32});
    Qwen35Model model(checkpoint.weights, *gpu);
    auto report = verify_vision_reference(model, vision, ImageProcessorConfig::from_dir(dir), dir, reference,
                                          fp32 ? 2e-3 : 2e-2, 16, !fp32);
    ASSERT_FALSE(report.checks.empty());
    for (const auto& check : report.checks) {
      std::printf("%s\n", fmt::format("{:<14} {:<40} max|Δ| {:.3e} (≤ {:.1e})", mode, check.name,
                                      check.max_abs_error, check.tolerance)
                              .c_str());
      EXPECT_TRUE(check.ok) << mode << " " << check.name << ": " << check.max_abs_error << " > "
                            << check.tolerance;
    }
  }
}

}  // namespace
}  // namespace moeserve
