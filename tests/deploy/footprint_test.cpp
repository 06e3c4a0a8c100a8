#include "deploy/footprint.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

using testing::safetensors_payload;

TEST(Footprint, WeightsMatchTheBf16CheckpointExactly) {
  auto cfg = ModelConfig::from_file("tests/fixtures/models/small-moe-realdims/config.json");
  Footprint f = footprint(cfg, Precision{}, 1, 8192, 1);
  EXPECT_DOUBLE_EQ(f.weights,
                   safetensors_payload("tests/fixtures/models/small-moe-realdims/model.safetensors"));
}

TEST(Footprint, WeightsMatchTheBlockFp8CheckpointExactly) {
  auto cfg = ModelConfig::from_file("tests/fixtures/models/small-moe-realdims-fp8/config.json");
  ASSERT_TRUE(cfg.fp8.has_value());
  Footprint f = footprint(cfg, Precision{"fp8", "bf16", "fp32"}, 1, 8192, 1);
  EXPECT_DOUBLE_EQ(f.weights,
                   safetensors_payload("tests/fixtures/models/small-moe-realdims-fp8/model.safetensors"));
}

TEST(Footprint, Qwen35_35B_MatchesThePublishedShape) {
  auto cfg = model_preset("qwen3.5-35b-a3b");
  ASSERT_TRUE(cfg.has_value());
  Footprint bf16 = footprint(*cfg, Precision{}, 1, 8192, 16);
  // ~34.7 B parameters (performance-anchors.md §5) -> ~69.4 GB in BF16.
  EXPECT_NEAR(bf16.weights / 2 / 1e9, 34.7, 0.1);
  // 10 attention layers x K,V x 2 KV heads x 256 x 2 B = 20 KiB per token (qwen35-model.md §3.3).
  EXPECT_DOUBLE_EQ(bf16.kv_per_token, 10.0 * 2 * 2 * 256 * 2);
  // 30 GDN layers x 32 heads x 128 x 128 fp32, plus the conv window of 3 x 8192 channels in the same dtype
  // (storage/state_cache.h: a slot stores both in the pool's dtype).
  EXPECT_DOUBLE_EQ(bf16.state_per_sequence, 30.0 * 32 * 128 * 128 * 4 + 30.0 * 8192 * 3 * 4);
  Footprint bf16_state = footprint(*cfg, Precision{"bf16", "bf16", "bf16"}, 1, 8192, 16);
  EXPECT_DOUBLE_EQ(bf16_state.state_per_sequence, bf16.state_per_sequence / 2);

  // FP8: 1 byte per projection weight, BF16 embeddings/lm_head/router: ~35.8 GB (the FP8 release is ~35 GB).
  Footprint fp8 = footprint(*cfg, Precision{"fp8", "bf16", "fp32"}, 1, 8192, 16);
  EXPECT_NEAR(fp8.weights / 1e9, 35.8, 0.3);
}

// The KV bytes per token are what the cache stores: fp32 (the CPU's auto), bf16 (a GPU's) or fp8.
TEST(Footprint, KvBytesPerTokenFollowTheKvCacheDtype) {
  auto cfg = *model_preset("qwen3.5-35b-a3b");
  const double bf16 = footprint(cfg, Precision{"fp8", "bf16", "fp32"}, 1, 8192, 16).kv_per_token;
  EXPECT_DOUBLE_EQ(footprint(cfg, Precision{"fp8", "fp32", "fp32"}, 1, 8192, 16).kv_per_token, 2 * bf16);
  EXPECT_DOUBLE_EQ(footprint(cfg, Precision{"fp8", "fp8", "fp32"}, 1, 8192, 16).kv_per_token, bf16 / 2);
  EXPECT_EQ(kv_precision("auto", true, "x"), "bf16");
  EXPECT_EQ(kv_precision("auto", false, "x"), "fp32");
  EXPECT_EQ(kv_precision("fp8_e4m3", false, "x"), "fp8");
  EXPECT_EQ(kv_precision("bfloat16", false, "x"), "bf16");
  EXPECT_THROW(kv_precision("fp16", true, "x"), Error);
}

TEST(Footprint, TensorParallelSplitsWeightsAndReplicatesScarceKvHeads) {
  auto cfg = *model_preset("qwen3.5-122b-a10b");
  Footprint one = footprint(cfg, Precision{"fp8", "bf16", "fp32"}, 1, 8192, 16);
  Footprint two = footprint(cfg, Precision{"fp8", "bf16", "fp32"}, 2, 8192, 16);
  Footprint four = footprint(cfg, Precision{"fp8", "bf16", "fp32"}, 4, 8192, 16);
  EXPECT_NEAR(two.weights / one.weights, 0.5, 0.01);
  EXPECT_DOUBLE_EQ(two.kv_per_token, one.kv_per_token / 2);  // 2 KV heads: one per rank
  EXPECT_DOUBLE_EQ(four.kv_per_token, two.kv_per_token);     // 4 ranks: a KV head is replicated
  EXPECT_DOUBLE_EQ(two.state_per_sequence, one.state_per_sequence / 2);
}

TEST(Footprint, FitsOnASparkAtTheReferenceSettings) {
  FitQuery q;
  q.config = *model_preset("qwen3.5-35b-a3b");
  q.model_name = "35b";
  q.precision.weights = "fp8";
  q.memory = 128e9;
  FitResult r = check_fit(q);
  EXPECT_TRUE(r.fits) << r.breakdown();
  EXPECT_DOUBLE_EQ(r.budget, 128e9 * 0.85);
  EXPECT_GT(r.max_concurrency, 16);
}

TEST(Footprint, RefusalOffersWhatWouldFit) {
  FitQuery q;
  q.config = *model_preset("qwen3.5-122b-a10b");
  q.model_name = "122b";
  q.tp = 2;
  q.memory = 128e9;  // a pair of Sparks in BF16: 122 GB of weights per rank
  FitResult r = check_fit(q);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.max_concurrency, 0);  // the weights alone exceed the budget
  ASSERT_FALSE(r.would_fit.empty());
  EXPECT_EQ(r.would_fit.front().rfind("dtype fp8", 0), 0u) << r.would_fit.front();
  bool offers_tp4 = false;
  for (const auto& w : r.would_fit) offers_tp4 = offers_tp4 || w.find("over 4 GPUs") != std::string::npos;
  EXPECT_TRUE(offers_tp4);

  // Too many long sequences: the nearest fits are fewer sequences or shorter ones.
  FitQuery load;
  load.config = *model_preset("qwen3.5-35b-a3b");
  load.model_name = "35b";
  load.precision.weights = "fp8";
  load.memory = 128e9;
  load.context = 262144;
  load.concurrency = 64;
  FitResult l = check_fit(load);
  EXPECT_FALSE(l.fits);
  ASSERT_GE(l.would_fit.size(), 2u);
  EXPECT_NE(l.would_fit[0].find("max_running_requests"), std::string::npos);
  EXPECT_NE(l.would_fit[1].find("max_model_len"), std::string::npos);
  // The suggestion itself fits.
  load.concurrency = int(l.max_concurrency);
  EXPECT_TRUE(check_fit(load).fits);
  EXPECT_GT(l.max_concurrency, 0);
}

TEST(Footprint, RejectsUnknownFormats) {
  FitQuery q;
  q.config = *model_preset("qwen3.5-35b-a3b");
  q.model_name = "35b";
  q.precision.weights = "int4";
  q.memory = 128e9;
  EXPECT_THROW(check_fit(q), Error);
}

}  // namespace
}  // namespace moeserve::deploy
