#include "model/init_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/checkpoint.h"
#include "model/fp8_quantize.h"
#include "test_util.h"

namespace moeserve {
namespace {

using ::testing::HasSubstr;
using namespace moeserve::testing;

const std::string kQwen3Tokenizer = ".cache/tokenizer-qwen3/tokenizer.json";

struct Stats {
  double mean = 0, var = 0;
};
Stats stats(const std::vector<float>& v) {
  Stats s;
  for (float x : v) s.mean += x;
  s.mean /= double(v.size());
  for (float x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= double(v.size());
  return s;
}

std::vector<float> all_values(const Matrix& m) {
  return dequantized(m);
}

TEST(InitModel, PresetsHaveTheDocumentedShapes) {
  ModelConfig c = preset_config("35b-a3b");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.count_layers(LayerType::FullAttention), 10);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.linear_conv_dim(), 8192);
  EXPECT_EQ(c.mtp_num_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{248046, 248044}));

  ModelConfig slice = preset_config("35b-a3b", 4);
  EXPECT_EQ(slice.num_layers, 4);
  EXPECT_EQ(slice.count_layers(LayerType::LinearAttention), 3);

  ModelConfig dense = preset_config("dense-0.8b");
  EXPECT_FALSE(dense.is_moe);
  EXPECT_TRUE(dense.tie_word_embeddings);
  EXPECT_EQ(dense.intermediate_size, 3584);
  EXPECT_EQ(preset_config("122b-a10b").hidden_size, 3072);

  // A preset's config.json is accepted by the real parser.
  for (const auto& name : preset_names()) {
    ModelConfig p = preset_config(name);
    EXPECT_EQ(ModelConfig::from_json(p.to_json()).summary(), p.summary()) << name;
  }
  EXPECT_THAT(
      error_of([] { preset_config("70b"); }),
      HasSubstr("unknown preset '70b' (known: tiny, small, 35b-a3b, 122b-a10b, 397b-a17b, dense-0.8b)"));
}

TEST(InitModel, TinyRoundTripsAndTheSameSeedGivesTheSameBytes) {
  TempDir a, b, c;
  InitModelOptions options;
  options.seed = 7;
  init_model(preset_config("tiny"), a.path(), options);
  init_model(preset_config("tiny"), b.path(), options);
  options.seed = 8;
  init_model(preset_config("tiny"), c.path(), options);
  EXPECT_EQ(read_bytes(a / "model.safetensors"), read_bytes(b / "model.safetensors"));
  EXPECT_NE(read_bytes(a / "model.safetensors"), read_bytes(c / "model.safetensors"));

  Checkpoint ck = open_checkpoint(a.path());
  const ModelWeights& w = ck.weights;
  EXPECT_EQ(w.config.summary(), preset_config("tiny").summary());
  EXPECT_EQ(w.layers.size(), 4u);
  EXPECT_EQ(w.layers[0].gdn.in_proj_qkv.rows, w.config.linear_conv_dim());
  EXPECT_EQ(w.layers[3].attn.q_proj.rows, 4 * 2 * 32);
  EXPECT_EQ(w.layers[1].moe.experts.size(), 8u);
  EXPECT_EQ(w.layers[1].moe.experts[7].down.cols, 32);
  // Per-expert names, as transformers 5.17 writes them.
  EXPECT_NE(ck.tensors->find("model.layers.1.mlp.experts.7.down_proj.weight"), nullptr);
  EXPECT_TRUE(fs::exists(a / "generation_config.json"));
}

TEST(InitModel, DummyWeightsEqualTheWrittenCheckpoint) {
  for (DType dtype : {DType::BF16, DType::F8_E4M3}) {
    TempDir dir;
    InitModelOptions options;
    options.seed = 11;
    options.dtype = dtype;
    init_model(preset_config("small"), dir.path(), options);
    ModelWeights loaded = load_checkpoint(dir.path());
    ModelWeights dummy = make_dummy_weights(preset_config("small"), 11, dtype);
    expect_same_weights(loaded, dummy);
  }
}

TEST(InitModel, WeightsKeepActivationsNearUnitScale) {
  ModelWeights w = make_dummy_weights(preset_config("small"), 3);
  auto qkv = stats(all_values(w.layers[0].gdn.in_proj_qkv));  // [1024, 256]: variance 1/256
  EXPECT_NEAR(qkv.mean, 0, 0.002);
  EXPECT_NEAR(qkv.var * 256, 1.0, 0.05);
  auto down = stats(all_values(w.layers[0].moe.experts[3].down));  // [256, 64]: variance 1/64
  EXPECT_NEAR(down.var * 64, 1.0, 0.05);
  auto embed = stats(all_values(w.embed));
  EXPECT_NEAR(embed.var, 1.0, 0.05);

  auto norm = stats(w.layers[1].post_norm);  // zero-centred: small around 0
  EXPECT_NEAR(norm.mean, 0, 0.03);
  EXPECT_LT(norm.var, 0.02);
  EXPECT_NEAR(stats(w.layers[0].gdn.norm).mean, 1.0, 0.03);  // the gated norm multiplies: around 1
  EXPECT_NEAR(stats(w.layers[0].gdn.dt_bias).mean, 1.0, 0.2);
  for (float a : w.layers[2].gdn.a_log) {
    EXPECT_GE(a, 0.0f);
    EXPECT_LE(a, std::log(16.0f) + 1e-2f);
  }
}

TEST(InitModel, Fp8CheckpointHasBlockScalesAndKeepsQwensModulesInBf16) {
  TempDir dir;
  InitModelOptions options;
  options.dtype = DType::F8_E4M3;
  init_model(preset_config("small"), dir.path(), options);
  auto config = read_json(dir / "config.json");
  EXPECT_EQ(config["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));

  ModelWeights fp8 = load_checkpoint(dir.path());
  ModelWeights bf16 = make_dummy_weights(preset_config("small"), 0);
  EXPECT_EQ(fp8.layers[3].attn.q_proj.dtype, DType::F8_E4M3);
  EXPECT_EQ(fp8.layers[3].attn.q_proj.block_rows, 128);
  EXPECT_EQ(fp8.layers[0].moe.experts[0].gate.dtype, DType::F8_E4M3);
  EXPECT_EQ(fp8.layers[0].moe.router.dtype, DType::BF16);
  EXPECT_EQ(fp8.layers[0].moe.shared_gate.dtype, DType::BF16);
  EXPECT_EQ(fp8.layers[0].gdn.in_proj_b.dtype, DType::BF16);
  EXPECT_EQ(fp8.embed.dtype, DType::BF16);
  EXPECT_EQ(fp8.lm_head.dtype, DType::BF16);
  // Dequantised FP8 stays within half an E4M3 step (relative 1/16) of the block's scale of the BF16 weights.
  auto a = all_values(fp8.layers[0].gdn.out_proj), b = all_values(bf16.layers[0].gdn.out_proj);
  const float* scales = fp8.layers[0].gdn.out_proj.scale_inv;
  for (size_t i = 0; i < a.size(); ++i) {
    size_t r = i / 512, c = i % 512;
    float scale = scales[r / 128 * 4 + c / 128];
    ASSERT_NEAR(a[i], b[i], std::fabs(b[i]) / 15 + scale * 0.01f + 0.01f * std::fabs(b[i])) << i;
  }
}

TEST(InitModel, DenseTiedPresetWritesNoLmHead) {
  ModelConfig c = preset_config("dense-0.8b", 1);
  c.vocab_size = 1024;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = 2;
  c.head_dim = 32;
  c.linear_num_key_heads = c.linear_num_value_heads = 2;
  c.linear_key_head_dim = c.linear_value_head_dim = 16;
  TempDir dir;
  init_model(c, dir.path(), {});
  Checkpoint ck = open_checkpoint(dir.path());
  EXPECT_EQ(ck.tensors->find("lm_head.weight"), nullptr);
  EXPECT_EQ(ck.weights.lm_head.data, ck.weights.embed.data);
  EXPECT_EQ(ck.weights.layers[0].mlp.down.cols, 96);
}

TEST(InitModel, MtpLayersAreWrittenAndSetAside) {
  ModelConfig c = preset_config("tiny");
  c.mtp_num_layers = 1;
  TempDir dir;
  init_model(c, dir.path(), {});
  Checkpoint ck = open_checkpoint(dir.path());
  EXPECT_EQ(ck.weights.config.mtp_num_layers, 1);
  // fc + 3 norms + one attention layer: 2 norms, 6 attention, router, 8 experts x 3, shared 3 + gate.
  EXPECT_EQ(ck.mtp_tensors.size(), 4u + 2 + 6 + 1 + 24 + 4);
  const TensorInfo* fc = ck.tensors->find("mtp.fc.weight");
  ASSERT_NE(fc, nullptr);
  EXPECT_EQ(fc->shape, (std::vector<int64_t>{64, 128}));
}

TEST(InitModel, ShardsPastTheShardSize) {
  TempDir dir;
  InitModelOptions options;
  options.max_shard_bytes = 300 * 1000;
  init_model(preset_config("tiny"), dir.path(), options);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  expect_same_weights(load_checkpoint(dir.path()), make_dummy_weights(preset_config("tiny"), 0));
}

TEST(InitModel, VocabFromATokenizerSetsSizeEosAndCopiesTheTokenizerFiles) {
  TempDir tok, out;
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 300; ++i) vocab["t" + std::to_string(i)] = i;
  write_json(tok / "tokenizer.json",
             {{"model", {{"type", "BPE"}, {"vocab", vocab}}},
              {"added_tokens",
               {{{"id", 300}, {"content", "<|endoftext|>"}}, {{"id", 302}, {"content", "<|im_end|>"}}}}});
  write_json(tok / "tokenizer_config.json", {{"eos_token", "<|im_end|>"}});
  std::ofstream(tok / "template.jinja") << "{{ messages }}";
  InitModelOptions options;
  options.vocab_from = tok / "tokenizer.json";
  options.chat_template = tok / "template.jinja";
  init_model(preset_config("tiny"), out.path(), options);

  ModelWeights w = load_checkpoint(out.path());
  EXPECT_EQ(w.config.vocab_size, 512);  // 303 tokens, padded to a multiple of 256
  EXPECT_EQ(w.config.eos_token_ids, (std::vector<int64_t>{302, 300}));
  EXPECT_EQ(read_bytes(out / "tokenizer.json"), read_bytes(tok / "tokenizer.json"));
  EXPECT_EQ(read_bytes(out / "tokenizer_config.json"), read_bytes(tok / "tokenizer_config.json"));
  EXPECT_EQ(read_bytes(out / "chat_template.jinja"), read_bytes(tok / "template.jinja"));
  EXPECT_EQ(read_json(out / "generation_config.json")["eos_token_id"], nlohmann::json({302, 300}));

  write_json(tok / "bad.json", {{"vocab", 1}});
  options.vocab_from = tok / "bad.json";
  EXPECT_THAT(error_of([&] { init_model(preset_config("tiny"), out.path(), options); }),
              HasSubstr("not a tokenizer.json"));
}

// `init-model --vocab-from DIR/tokenizer.json --out DIR`: the tokenizer files are already where they belong
// and stay as they were (copying a file onto itself failed with "File exists").
TEST(InitModel, WritesIntoTheDirectoryItsTokenizerComesFrom) {
  TempDir dir;
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 300; ++i) vocab["t" + std::to_string(i)] = i;
  write_json(dir / "tokenizer.json", {{"model", {{"type", "BPE"}, {"vocab", vocab}}},
                                      {"added_tokens", {{{"id", 300}, {"content", "<|im_end|>"}}}}});
  write_json(dir / "tokenizer_config.json", {{"eos_token", "<|im_end|>"}});
  std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
  auto tokenizer = read_bytes(dir / "tokenizer.json");
  auto tokenizer_config = read_bytes(dir / "tokenizer_config.json");
  InitModelOptions options;
  options.vocab_from = dir / "tokenizer.json";
  options.chat_template = dir / "chat_template.jinja";
  init_model(preset_config("tiny"), dir.path(), options);

  ModelWeights w = load_checkpoint(dir.path());
  EXPECT_EQ(w.config.vocab_size, 512);
  EXPECT_EQ(w.config.eos_token_ids, (std::vector<int64_t>{300}));
  EXPECT_EQ(read_bytes(dir / "tokenizer.json"), tokenizer);
  EXPECT_EQ(read_bytes(dir / "tokenizer_config.json"), tokenizer_config);
  auto chat_template = read_bytes(dir / "chat_template.jinja");
  EXPECT_EQ(std::string(chat_template.begin(), chat_template.end()), "{{ messages }}");
}

TEST(InitModel, DemoModelUsesTheQwen3Vocabulary) {
  ASSERT_TRUE(fs::exists(kQwen3Tokenizer))
      << kQwen3Tokenizer << " is missing: run scripts/fetch-test-data.sh";
  TempDir out;
  InitModelOptions options;
  options.vocab_from = kQwen3Tokenizer;
  init_model(preset_config("tiny"), out.path(), options);
  ModelWeights w = load_checkpoint(out.path());
  EXPECT_EQ(w.config.vocab_size, 151808);  // 151669 tokens
  EXPECT_EQ(w.config.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
}

TEST(InitModel, CommandLineWritesALoadableCheckpoint) {
  TempDir out;
  std::string cmd = std::string(MOESERVE_BINARY) +
                    " --log-level warn init-model --preset small --layers 2 --seed 5 --out " + out.path() +
                    " > " + (out / "stdout.txt") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ModelWeights w = load_checkpoint(out.path());
  EXPECT_EQ(w.config.num_layers, 2);
  expect_same_weights(w, make_dummy_weights(preset_config("small", 2), 5));

  std::string bad = std::string(MOESERVE_BINARY) + " init-model --preset huge --out " + (out / "x") + " > " +
                    (out / "err.txt") + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream err(out / "err.txt");
  std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("unknown preset 'huge'"));
}

TEST(Fp8Quantize, NearestMatchesTheReferenceRounding) {
  // Every bf16 value (covers all exponents, subnormals, ties, saturation, NaN) plus values between them.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    for (uint32_t low : {0u, 0x8000u, 0x7fffu}) {
      float f;
      uint32_t u = bits << 16 | low;
      std::memcpy(&f, &u, 4);
      ASSERT_EQ(fp8_e4m3_nearest(f), f32_to_fp8_e4m3(f)) << f << " bits " << std::hex << u;
    }
  }
}

TEST(Fp8Quantize, BandScalesAreBlockAmaxOver448) {
  std::vector<float> w = {1, -2, 3, 0.5f, 4, 0, 0, -448 * 2};  // 2 rows x 4 cols, blocks of 2 columns
  std::vector<uint8_t> q(8);
  std::vector<float> s(2);
  quantize_fp8_band(w.data(), 2, 4, 2, q.data(), s.data());
  EXPECT_FLOAT_EQ(s[0], 4.0f / 448);
  EXPECT_FLOAT_EQ(s[1], 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(q[4]) * s[0], 4.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(q[7]) * s[1], -896.0f);
}

}  // namespace
}  // namespace moeserve
