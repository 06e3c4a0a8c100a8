// Checkpoints through the forward pass: the same model stored as F32 or F16 computes the BF16 logits, random
// weights stand in for a checkpoint's files (--load-format dummy), and `verify --layers` names the layer of a
// deliberately broken copy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/safetensors.h"
#include "model/sequence.h"
#include "model/verify.h"
#include "test_util.h"

namespace moeserve {
namespace {

using ::testing::HasSubstr;
using namespace moeserve::testing;

const std::string kTinyMoe = "tests/fixtures/models/tiny-moe";

// Rewrites every BF16 tensor of `src` into `dtype` (F32: exact; F16: exact for every value inside F16's
// range, rounded below it).
void convert_checkpoint(const std::string& src, const std::string& dst, DType dtype) {
  rewrite_checkpoint(src, dst, [&](std::vector<TensorWrite>& tensors) {
    for (auto& t : tensors) {
      if (t.dtype != DType::BF16) continue;
      std::vector<uint8_t> bf16(t.nbytes());
      t.fill(bf16.data());
      const size_t n = bf16.size() / 2;
      std::vector<uint8_t> out(n * dtype_size(dtype));
      for (size_t i = 0; i < n; ++i) {
        const float v = bf16_to_f32(uint16_t(bf16[2 * i] | bf16[2 * i + 1] << 8));
        if (dtype == DType::F32) {
          std::memcpy(out.data() + 4 * i, &v, 4);
        } else {
          const uint16_t h = f32_to_f16(v);
          std::memcpy(out.data() + 2 * i, &h, 2);
        }
      }
      t = TensorWrite::copy_of(t.name, dtype, t.shape, out);
    }
  });
}

// The logits of every position of `prompt` (one prefill, no cache reuse).
std::vector<float> prompt_logits(const ModelWeights& weights, const std::vector<int32_t>& prompt) {
  auto backend = make_cpu_backend();
  Qwen35Model model(weights, *backend);
  SequenceRunner runner(model, int64_t(prompt.size()) + 1);
  return runner.prefill(prompt, /*all_logits=*/true).logits;
}

const std::vector<int32_t> kPrompt = {1, 17, 300, 42, 511, 0, 7, 99, 256, 3, 128, 64};

TEST(CheckpointDtypes, F32CopyLoadsAsF32AndComputesTheBf16Logits) {
  TempDir dir;
  convert_checkpoint(kTinyMoe, dir.path(), DType::F32);
  ModelWeights bf16 = load_checkpoint(kTinyMoe), f32 = load_checkpoint(dir.path());
  auto mb = all_matrices(bf16), mf = all_matrices(f32);
  ASSERT_EQ(mb.size(), mf.size());
  for (size_t i = 0; i < mf.size(); ++i) {
    if (mf[i]->empty()) continue;
    EXPECT_EQ(mf[i]->dtype, DType::F32) << i;
    ASSERT_EQ(dequantized(*mf[i]), dequantized(*mb[i])) << i;  // widening bf16 is exact
  }
  EXPECT_EQ(f32.final_norm, bf16.final_norm);
  EXPECT_EQ(f32.layers[0].gdn.a_log, bf16.layers[0].gdn.a_log);

  // The same float32 values in the same order of arithmetic: the very same logits.
  EXPECT_EQ(prompt_logits(f32, kPrompt), prompt_logits(bf16, kPrompt));
}

TEST(CheckpointDtypes, F16CopyComputesTheBf16LogitsWithinTolerance) {
  TempDir dir;
  convert_checkpoint(kTinyMoe, dir.path(), DType::F16);
  ModelWeights bf16 = load_checkpoint(kTinyMoe), f16 = load_checkpoint(dir.path());
  // F16 holds every bf16 value of this checkpoint's range with its 8 mantissa bits, except the tiny ones
  // below F16's normal range (2^-14), which lose bits.
  size_t checked = 0, exact = 0;
  auto mb = all_matrices(bf16), mh = all_matrices(f16);
  for (size_t i = 0; i < mh.size(); ++i) {
    if (mh[i]->empty()) continue;
    EXPECT_EQ(mh[i]->dtype, DType::F16) << i;
    auto a = dequantized(*mb[i]), b = dequantized(*mh[i]);
    for (size_t j = 0; j < a.size(); ++j) {
      ++checked;
      if (a[j] == b[j]) {
        ++exact;
      } else {
        ASSERT_LT(std::abs(a[j]), 6.2e-5f) << "matrix " << i << " element " << j;
        ASSERT_NEAR(b[j], a[j], 3e-8f) << "matrix " << i << " element " << j;  // half an F16 subnormal step
      }
    }
  }
  EXPECT_GT(exact, checked * 99 / 100);
  EXPECT_EQ(f16.final_norm, bf16.final_norm);

  auto want = prompt_logits(bf16, kPrompt), got = prompt_logits(f16, kPrompt);
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, double(std::abs(got[i] - want[i])));
  EXPECT_LT(max_diff, 3e-5);  // 4e-6 measured: 13 of 372,480 weights moved by under 3e-8
  // And the F16 copy still passes the Hugging Face reference of the BF16 original.
  auto backend = make_cpu_backend();
  f16.config.rope_bf16_inv_freq = true;  // the reference was made with bf16 RoPE frequencies
  Qwen35Model model(f16, *backend);
  auto report = verify_against_reference(model, TensorSet::open_file(kTinyMoe + "/reference.safetensors"),
                                         {1e-3, true});
  EXPECT_TRUE(report.passed);
}

TEST(CheckpointDtypes, F16NormsAndF64VectorsAreWidenedToTheSameFloats) {
  // Small vectors may come in any float type; they all widen to the same float32 values.
  TempDir dir;
  rewrite_checkpoint(kTinyMoe, dir.path(), [](std::vector<TensorWrite>& tensors) {
    for (auto& t : tensors) {
      const bool norm = t.name == "model.norm.weight", a_log = t.name == "model.layers.0.linear_attn.A_log";
      if (!norm && !a_log) continue;
      std::vector<uint8_t> bf16(t.nbytes());
      t.fill(bf16.data());
      const size_t n = bf16.size() / 2;
      std::vector<uint8_t> out(n * (norm ? 2 : 8));
      for (size_t i = 0; i < n; ++i) {
        const float v = bf16_to_f32(uint16_t(bf16[2 * i] | bf16[2 * i + 1] << 8));
        if (norm) {
          const uint16_t h = f32_to_f16(v);
          std::memcpy(out.data() + 2 * i, &h, 2);
        } else {
          const double d = v;
          std::memcpy(out.data() + 8 * i, &d, 8);
        }
      }
      t = TensorWrite::copy_of(t.name, norm ? DType::F16 : DType::F64, t.shape, out);
    }
  });
  ModelWeights bf16 = load_checkpoint(kTinyMoe), mixed = load_checkpoint(dir.path());
  EXPECT_EQ(mixed.final_norm, bf16.final_norm);
  EXPECT_EQ(mixed.layers[0].gdn.a_log, bf16.layers[0].gdn.a_log);
  EXPECT_EQ(prompt_logits(mixed, kPrompt), prompt_logits(bf16, kPrompt));
}

// `serve --load-format dummy --model DIR` reads only DIR/config.json and makes the weights: the same bytes,
// and so the same logits, as the checkpoint `init-model` writes with that seed.
TEST(DummyLoadFormat, ConfigAloneGivesTheWeightsAndLogitsOfTheInitModelCheckpoint) {
  TempDir written, config_only;
  InitModelOptions options;
  options.seed = 3;
  init_model(ModelConfig::from_file(kTinyMoe + "/config.json"), written.path(), options);
  fs::copy_file(kTinyMoe + "/config.json", config_only / "config.json");
  ModelConfig config = ModelConfig::from_file(config_only / "config.json");

  ModelWeights dummy = make_dummy_weights(config, 3), loaded = load_checkpoint(written.path());
  expect_same_weights(dummy, loaded);
  const auto logits = prompt_logits(dummy, kPrompt);
  EXPECT_EQ(logits, prompt_logits(loaded, kPrompt));
  for (float l : logits) ASSERT_TRUE(std::isfinite(l));
  // Random weights of the fixture's shape, not the fixture's weights; another seed, other weights.
  EXPECT_NE(logits, prompt_logits(load_checkpoint(kTinyMoe), kPrompt));
  EXPECT_NE(logits, prompt_logits(make_dummy_weights(config, 4), kPrompt));
  // The directory has no weights, so a normal load is a clear error.
  EXPECT_THAT(error_of([&] { load_checkpoint(config_only.path()); }), HasSubstr("safetensors"));
}

// `verify --layers`: a checkpoint with one layer broken passes nothing, and the report names that layer.
TEST(VerifyLayers, NamesTheFirstLayerOfAPerturbedCheckpoint) {
  struct Case {
    std::string tensor;
    std::string layer;
  };
  for (const Case& c :
       {Case{"model.layers.1.linear_attn.out_proj.weight", "layer 1 (linear_attention)"},
        Case{"model.layers.3.self_attn.o_proj.weight", "layer 3 (full_attention) + final norm"},
        Case{"model.layers.2.mlp.shared_expert.down_proj.weight", "layer 2 (linear_attention)"}}) {
    SCOPED_TRACE(c.tensor);
    TempDir dir;
    rewrite_checkpoint(kTinyMoe, dir.path(), [&](std::vector<TensorWrite>& tensors) {
      for (auto& t : tensors) {
        if (t.name != c.tensor) continue;
        std::vector<uint8_t> bytes(t.nbytes());
        t.fill(bytes.data());
        for (size_t i = 0; i < bytes.size(); i += 2) {  // every weight doubled: the exponent goes up by one
          const float v = bf16_to_f32(uint16_t(bytes[i] | bytes[i + 1] << 8)) * 2.0f;
          const uint16_t b = f32_to_bf16(v);
          bytes[i] = uint8_t(b), bytes[i + 1] = uint8_t(b >> 8);
        }
        t = TensorWrite::copy_of(t.name, t.dtype, t.shape, bytes);
      }
    });
    ModelWeights weights = load_checkpoint(dir.path());
    weights.config.rope_bf16_inv_freq = true;
    auto backend = make_cpu_backend();
    Qwen35Model model(weights, *backend);
    auto report = verify_against_reference(model, TensorSet::open_file(kTinyMoe + "/reference.safetensors"),
                                           {1e-3, true});
    EXPECT_FALSE(report.passed);
    EXPECT_EQ(report.first_divergent_layer, c.layer);
    // Every layer before it still agrees with the reference.
    ASSERT_EQ(report.layers.size(), 5u);
    for (const auto& l : report.layers) {
      if (l.name == c.layer) break;
      EXPECT_LE(l.max_abs_error, 1e-3) << l.name;
    }
  }
}

}  // namespace
}  // namespace moeserve
