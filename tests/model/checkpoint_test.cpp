#include "model/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/safetensors.h"
#include "test_util.h"

namespace moeserve {
namespace {

using ::testing::HasSubstr;
using namespace moeserve::testing;

const std::string kFixtures = "tests/fixtures/models/";

std::vector<float> bf16_values(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = bf16_to_f32(uint16_t(bytes[2 * i] | bytes[2 * i + 1] << 8));
  return out;
}

size_t count_tensors(const std::string& dir, const std::string& prefix = "") {
  size_t n = 0;
  TensorSet set = TensorSet::open_dir(dir);
  for (const auto& t : set.tensors()) n += t.name.starts_with(prefix);
  return n;
}

TEST(Checkpoint, LoadsTinyMoeWithEveryTensorInPlace) {
  std::string dir = kFixtures + "tiny-moe";
  Checkpoint ck = open_checkpoint(dir);
  const ModelWeights& w = ck.weights;
  const ModelConfig& c = w.config;
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_TRUE(c.is_moe);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(ck.tensors->tensors().size(), 160u);
  EXPECT_TRUE(ck.mtp_tensors.empty());
  EXPECT_TRUE(ck.vision_tensors.empty());

  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_EQ(w.layers[0].type, LayerType::LinearAttention);
  EXPECT_EQ(w.layers[3].type, LayerType::FullAttention);
  EXPECT_EQ(w.embed.rows, 512);
  EXPECT_EQ(w.embed.cols, 64);
  EXPECT_NE(w.lm_head.data, w.embed.data);
  const auto& gdn = w.layers[0].gdn;
  EXPECT_EQ(gdn.in_proj_qkv.rows, 128);
  EXPECT_EQ(gdn.conv1d.size(), 128u * 4);
  EXPECT_EQ(gdn.norm.size(), 16u);
  EXPECT_TRUE(w.layers[0].attn.q_proj.empty());
  const auto& attn = w.layers[3].attn;
  EXPECT_EQ(attn.q_proj.rows, 4 * 2 * 32);
  EXPECT_EQ(attn.o_proj.cols, 4 * 32);
  EXPECT_EQ(attn.q_norm.size(), 32u);
  ASSERT_EQ(w.layers[3].moe.experts.size(), 8u);
  EXPECT_EQ(w.layers[3].moe.experts[7].down.rows, 64);
  EXPECT_EQ(w.layers[3].moe.experts[7].down.cols, 32);
  EXPECT_EQ(w.layers[3].moe.shared_gate.rows, 1);
  for (const Matrix* m : all_matrices(w)) {
    if (!m->empty()) {
      EXPECT_EQ(m->dtype, DType::BF16);
    }
  }
}

TEST(Checkpoint, ViewsPointAtTheFileBytesAndVectorsAreWidened) {
  std::string dir = kFixtures + "tiny-moe", file = dir + "/model.safetensors";
  ModelWeights w = load_checkpoint(dir);

  auto qkv = raw_tensor(file, "model.layers.0.linear_attn.in_proj_qkv.weight");
  EXPECT_EQ(matrix_bytes(w.layers[0].gdn.in_proj_qkv), qkv.bytes);
  auto expert = raw_tensor(file, "model.layers.2.mlp.experts.5.up_proj.weight");
  EXPECT_EQ(matrix_bytes(w.layers[2].moe.experts[5].up), expert.bytes);
  auto lm_head = raw_tensor(file, "lm_head.weight");
  EXPECT_EQ(matrix_bytes(w.lm_head), lm_head.bytes);

  EXPECT_EQ(w.layers[1].gdn.a_log, bf16_values(raw_tensor(file, "model.layers.1.linear_attn.A_log").bytes));
  EXPECT_EQ(w.layers[3].attn.k_norm,
            bf16_values(raw_tensor(file, "model.layers.3.self_attn.k_norm.weight").bytes));
  EXPECT_EQ(w.final_norm, bf16_values(raw_tensor(file, "model.norm.weight").bytes));
  // conv1d [C, 1, K] becomes [C][K]: channel c's taps are contiguous.
  auto conv = bf16_values(raw_tensor(file, "model.layers.0.linear_attn.conv1d.weight").bytes);
  EXPECT_EQ(w.layers[0].gdn.conv1d, conv);
  EXPECT_EQ(w.layers[0].gdn.conv1d[5 * 4 + 3], conv[5 * 4 + 3]);

  std::vector<float> row(64);
  w.layers[0].moe.router.row_f32(3, row.data());
  auto router = bf16_values(raw_tensor(file, "model.layers.0.mlp.gate.weight").bytes);
  EXPECT_EQ(row, std::vector<float>(router.begin() + 3 * 64, router.begin() + 4 * 64));
}

TEST(Checkpoint, LoadsTheDenseFixture) {
  std::string dir = kFixtures + "tiny-dense";
  ModelWeights w = load_checkpoint(dir);
  EXPECT_FALSE(w.config.is_moe);
  EXPECT_EQ(w.config.model_type, "qwen3_5_text");
  EXPECT_EQ(w.config.intermediate_size, 128);
  EXPECT_EQ(w.layers[2].mlp.gate.rows, 128);
  EXPECT_EQ(w.layers[2].mlp.down.cols, 128);
  EXPECT_TRUE(w.layers[2].moe.experts.empty());
  EXPECT_EQ(matrix_bytes(w.layers[2].mlp.down),
            raw_tensor(dir + "/model.safetensors", "model.layers.2.mlp.down_proj.weight").bytes);
}

TEST(Checkpoint, VisionLanguageLayoutUsesTheLanguageModelPrefixAndSetsVisionAside) {
  std::string dir = kFixtures + "tiny-moe-vl-layout";
  Checkpoint ck = open_checkpoint(dir);
  EXPECT_EQ(ck.weights.config.model_type, "qwen3_5_moe");
  EXPECT_EQ(ck.weights.config.hidden_size, 64);
  EXPECT_EQ(ck.vision_tensors.size(), count_tensors(dir, "model.visual."));
  EXPECT_GT(ck.vision_tensors.size(), 0u);
  EXPECT_EQ(matrix_bytes(ck.weights.embed),
            raw_tensor(dir + "/model.safetensors", "model.language_model.embed_tokens.weight").bytes);
  // Same weights as the flat fixture would have had under model.: only the names differ.
  EXPECT_EQ(ck.weights.layers[3].moe.experts.size(), 8u);
}

TEST(Checkpoint, LoadsRealDimsAndItsFp8TwinWithBlockScales) {
  ModelWeights bf = load_checkpoint(kFixtures + "small-moe-realdims");
  EXPECT_EQ(bf.config.head_dim, 256);
  EXPECT_EQ(bf.config.linear_conv_dim(), 1024);
  EXPECT_EQ(bf.layers[0].moe.experts.size(), 16u);

  std::string dir = kFixtures + "small-moe-realdims-fp8", file = dir + "/model.safetensors";
  ModelWeights w = load_checkpoint(dir);
  ASSERT_TRUE(w.config.fp8.has_value());
  EXPECT_EQ(w.config.fp8->block_out, 128);
  EXPECT_EQ(count_tensors(dir), 473u);

  const Matrix& q = w.layers[3].attn.q_proj;  // [1024, 256] FP8, scales [8, 2]
  EXPECT_EQ(q.dtype, DType::F8_E4M3);
  EXPECT_EQ(q.block_rows, 128);
  EXPECT_EQ(q.block_cols, 128);
  ASSERT_NE(q.scale_inv, nullptr);
  auto raw = raw_tensor(file, "model.layers.3.self_attn.q_proj.weight");
  auto raw_scale = raw_tensor(file, "model.layers.3.self_attn.q_proj.weight_scale_inv");
  ASSERT_EQ(raw_scale.shape, (std::vector<int64_t>{8, 2}));
  std::vector<float> scales(raw_scale.bytes.size() / 4);
  std::memcpy(scales.data(), raw_scale.bytes.data(), raw_scale.bytes.size());
  std::vector<float> row(256);
  for (int64_t r : {0, 127, 128, 700, 1023}) {
    q.row_f32(r, row.data());
    for (int64_t c = 0; c < 256; ++c)
      ASSERT_EQ(row[size_t(c)],
                fp8_e4m3_to_f32(raw.bytes[size_t(r * 256 + c)]) * scales[size_t(r / 128 * 2 + c / 128)])
          << r << "," << c;
  }
  // Experts [64, 256] are one block row high; their scales are [1, 2].
  const Matrix& gate = w.layers[1].moe.experts[9].gate;
  EXPECT_EQ(gate.dtype, DType::F8_E4M3);
  EXPECT_EQ(gate.scale_cols(), 2);
  // modules_to_not_convert stay BF16: router, shared_expert_gate, in_proj_a/b, embeddings.
  EXPECT_EQ(w.layers[0].moe.router.dtype, DType::BF16);
  EXPECT_EQ(w.layers[0].moe.router.scale_inv, nullptr);
  EXPECT_EQ(w.layers[0].gdn.in_proj_a.dtype, DType::BF16);
  EXPECT_EQ(w.embed.dtype, DType::BF16);

  // The FP8 weights approximate the BF16 twin's (same seed, then quantised): within an FP8 step.
  std::vector<float> a(256), b(256);
  bf.layers[0].gdn.in_proj_qkv.row_f32(10, a.data());
  w.layers[0].gdn.in_proj_qkv.row_f32(10, b.data());
  for (size_t c = 0; c < 256; ++c) EXPECT_NEAR(a[c], b[c], std::fabs(a[c]) / 8 + 1e-3) << c;
}

// Writes tiny-moe with its experts fused the way the in-memory HF module holds them.
void fuse_experts(std::vector<TensorWrite>& tensors, const TensorSet& src, int layers, int experts, int inter,
                  int hidden) {
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<uint8_t> gate_up, down;
    for (int e = 0; e < experts; ++e) {
      for (const char* part : {"gate_proj", "up_proj"}) {
        const TensorInfo* t = src.find(p + std::to_string(e) + "." + part + ".weight");
        gate_up.insert(gate_up.end(), t->data, t->data + t->nbytes);
      }
      const TensorInfo* d = src.find(p + std::to_string(e) + ".down_proj.weight");
      down.insert(down.end(), d->data, d->data + d->nbytes);
      for (const char* part : {"gate_proj", "up_proj", "down_proj"})
        erase_tensor(tensors, p + std::to_string(e) + "." + part + ".weight");
    }
    tensors.push_back(
        TensorWrite::copy_of(p + "gate_up_proj", DType::BF16, {experts, 2 * inter, hidden}, gate_up));
    tensors.push_back(TensorWrite::copy_of(p + "down_proj", DType::BF16, {experts, hidden, inter}, down));
  }
}

TEST(Checkpoint, FusedExpertsLoadToTheSameMatricesAsPerExpert) {
  std::string src = kFixtures + "tiny-moe";
  TempDir out;
  TensorSet set = TensorSet::open_dir(src);
  rewrite_checkpoint(src, out.path(), [&](auto& tensors) { fuse_experts(tensors, set, 4, 8, 32, 64); });
  ASSERT_EQ(count_tensors(out.path(), "model.layers.0.mlp.experts."), 2u);
  ModelWeights fused = load_checkpoint(out.path());
  ModelWeights per_expert = load_checkpoint(src);
  expect_same_weights(fused, per_expert);
}

TEST(Checkpoint, ShardedCopyLoadsIdentically) {
  std::string src = kFixtures + "tiny-moe";
  TempDir out;
  rewrite_checkpoint(src, out.path(), {}, {}, 200 * 1024);
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(out / "model-00004-of-00004.safetensors"));
  expect_same_weights(load_checkpoint(out.path()), load_checkpoint(src));
}

TEST(Checkpoint, ListsEveryMissingUnexpectedMisShapedAndMisTypedTensor) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe", out.path(), [](std::vector<TensorWrite>& tensors) {
    erase_tensor(tensors, "model.layers.1.linear_attn.dt_bias");
    erase_tensor(tensors, "model.layers.2.mlp.experts.3.down_proj.weight");
    erase_tensor(tensors, "model.layers.3.self_attn.q_norm.weight");
    erase_tensor(tensors, "model.layers.0.linear_attn.out_proj.weight");
    erase_tensor(tensors, "model.layers.0.linear_attn.A_log");
    tensors.push_back(TensorWrite::copy_of("model.layers.3.self_attn.q_norm.weight", DType::BF16, {16},
                                           std::vector<uint8_t>(32)));
    tensors.push_back(TensorWrite::copy_of("model.layers.0.linear_attn.out_proj.weight", DType::I32, {64, 64},
                                           std::vector<uint8_t>(64 * 64 * 4)));
    tensors.push_back(TensorWrite::copy_of("model.layers.0.linear_attn.A_log", DType::F8_E4M3, {4},
                                           std::vector<uint8_t>(4)));
    tensors.push_back(TensorWrite::copy_of("model.layers.9.mlp.gate.weight", DType::BF16, {8, 64},
                                           std::vector<uint8_t>(8 * 64 * 2)));
  });
  std::string message = error_of([&] { load_checkpoint(out.path()); });
  EXPECT_THAT(message, HasSubstr("the tensors do not match config.json"));
  EXPECT_THAT(message, HasSubstr("6 problems"));
  EXPECT_THAT(message, HasSubstr("missing model.layers.1.linear_attn.dt_bias (expected [4])"));
  EXPECT_THAT(message,
              HasSubstr("missing model.layers.2.mlp.experts.3.down_proj.weight (expected [64, 32])"));
  EXPECT_THAT(message, HasSubstr("model.layers.3.self_attn.q_norm.weight has shape [16], expected [32]"));
  EXPECT_THAT(message, HasSubstr("model.layers.0.linear_attn.out_proj.weight has dtype I32"));
  EXPECT_THAT(message, HasSubstr("model.layers.0.linear_attn.A_log has dtype F8_E4M3"));
  EXPECT_THAT(message, HasSubstr("unexpected tensor model.layers.9.mlp.gate.weight (BF16 [8, 64])"));
}

TEST(Checkpoint, UnknownModelTypeNamesTheSupportedOnes) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-dense", out.path(), {}, [](auto& c) { c["model_type"] = "llama"; });
  std::string message = error_of([&] { load_checkpoint(out.path()); });
  EXPECT_THAT(message, HasSubstr("unsupported model_type 'llama'"));
  EXPECT_THAT(message, HasSubstr("qwen3_5_moe, qwen3_5_moe_text, qwen3_5, qwen3_5_text"));
}

TEST(Checkpoint, MtpTensorsAreSetAsideAndStayFindable) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe", out.path(), [](std::vector<TensorWrite>& tensors) {
    tensors.push_back(
        TensorWrite::copy_of("mtp.fc.weight", DType::BF16, {64, 128}, std::vector<uint8_t>(64 * 128 * 2)));
    tensors.push_back(
        TensorWrite::copy_of("mtp.norm.weight", DType::BF16, {64}, std::vector<uint8_t>(128, 1)));
  });
  Checkpoint ck = open_checkpoint(out.path());
  EXPECT_THAT(ck.mtp_tensors, ::testing::UnorderedElementsAre("mtp.fc.weight", "mtp.norm.weight"));
  const TensorInfo* norm = ck.tensors->find("mtp.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->data[5], 1);
}

TEST(Checkpoint, TiedEmbeddingsShareTheEmbeddingView) {
  TempDir out;
  rewrite_checkpoint(
      kFixtures + "tiny-dense", out.path(), [](auto& tensors) { erase_tensor(tensors, "lm_head.weight"); },
      [](auto& c) { c["tie_word_embeddings"] = true; });
  ModelWeights w = load_checkpoint(out.path());
  EXPECT_EQ(w.lm_head.data, w.embed.data);
  EXPECT_EQ(w.lm_head.rows, 512);

  // Without the tie, the missing lm_head is reported.
  rewrite_checkpoint(kFixtures + "tiny-dense", out.path(),
                     [](auto& tensors) { erase_tensor(tensors, "lm_head.weight"); });
  EXPECT_THAT(error_of([&] { load_checkpoint(out.path()); }),
              HasSubstr("missing lm_head.weight (expected [512, 64])"));
}

TEST(Checkpoint, EosIdsComeFromGenerationConfigWhenConfigHasNone) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe", out.path(), {});
  write_json(out / "generation_config.json", {{"eos_token_id", {7, 9}}});
  EXPECT_EQ(load_checkpoint(out.path()).config.eos_token_ids, (std::vector<int64_t>{7, 9}));

  auto config = read_json(out / "config.json");
  config["eos_token_id"] = 3;
  write_json(out / "config.json", config);
  EXPECT_EQ(load_checkpoint(out.path()).config.eos_token_ids, (std::vector<int64_t>{3}));
}

TEST(Checkpoint, Fp8WeightWithoutScalesOrQuantizationConfigIsReported) {
  std::string src = kFixtures + "small-moe-realdims-fp8";
  TempDir out;
  rewrite_checkpoint(src, out.path(), [](auto& tensors) {
    erase_tensor(tensors, "model.layers.3.self_attn.k_proj.weight_scale_inv");
  });
  EXPECT_THAT(
      error_of([&] { load_checkpoint(out.path()); }),
      HasSubstr("missing model.layers.3.self_attn.k_proj.weight_scale_inv (block scales of the FP8 weight "
                "model.layers.3.self_attn.k_proj.weight, expected [2, 2])"));

  rewrite_checkpoint(src, out.path(), {}, [](auto& c) { c.erase("quantization_config"); });
  EXPECT_THAT(error_of([&] { load_checkpoint(out.path()); }),
              HasSubstr("is F8_E4M3 but config.json has no fp8 quantization_config"));
}

// FP8 KV cache scales as vLLM finds them: self_attn.k_scale / v_scale scalars, or under k_proj / v_proj
// (older exporters); absent ones are 0 (the cache uses 1.0); per-head or non-positive ones are refused.
TEST(Checkpoint, KvCacheScalesAreReadWhereTheCheckpointHasThem) {
  auto scalar = [](const std::string& name, float v, std::vector<int64_t> shape = {}) {
    std::vector<uint8_t> bytes(4);
    std::memcpy(bytes.data(), &v, 4);
    return TensorWrite::copy_of(name, DType::F32, std::move(shape), bytes);
  };
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe", out.path(), [&](std::vector<TensorWrite>& tensors) {
    tensors.push_back(scalar("model.layers.3.self_attn.k_scale", 0.125f));
    tensors.push_back(scalar("model.layers.3.self_attn.v_proj.v_scale", 2.5f, {1}));
  });
  ModelWeights w = load_checkpoint(out.path());
  ASSERT_EQ(w.layers[3].type, LayerType::FullAttention);
  EXPECT_EQ(w.layers[3].attn.k_scale, 0.125f);
  EXPECT_EQ(w.layers[3].attn.v_scale, 2.5f);
  EXPECT_EQ(load_checkpoint(kFixtures + "tiny-moe").layers[3].attn.k_scale, 0.0f);

  rewrite_checkpoint(kFixtures + "tiny-moe", out.path(), [&](std::vector<TensorWrite>& tensors) {
    std::vector<uint8_t> two(8);
    tensors.push_back(TensorWrite::copy_of("model.layers.3.self_attn.k_scale", DType::F32, {2}, two));
    tensors.push_back(scalar("model.layers.3.self_attn.v_scale", -1.0f));
  });
  const std::string message = error_of([&] { load_checkpoint(out.path()); });
  EXPECT_THAT(message, HasSubstr("model.layers.3.self_attn.k_scale is F32 [2], expected one float"));
  EXPECT_THAT(message, HasSubstr("model.layers.3.self_attn.v_scale is -1, expected a positive finite scale"));
}

TEST(Checkpoint, MissingDirectoryOrConfigIsAnError) {
  EXPECT_THAT(error_of([] { load_checkpoint("tests/fixtures/models/nope"); }),
              HasSubstr("is not a checkpoint directory"));
  TempDir out;
  EXPECT_THAT(error_of([&] { load_checkpoint(out.path()); }), HasSubstr("config.json"));
}

}  // namespace
}  // namespace moeserve
