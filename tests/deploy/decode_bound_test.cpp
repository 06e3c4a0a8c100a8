#include "deploy/decode_bound.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

using testing::safetensors_payload;

TEST(DecodeBound, ExpertsTouchedUnderUniformRouting) {
  EXPECT_DOUBLE_EQ(expected_experts_touched(256, 8, 0), 0.0);
  EXPECT_NEAR(expected_experts_touched(256, 8, 1), 8.0, 1e-9);
  // 256 (1 - (31/32)^tokens): 16 tokens 101.96, 64 tokens 222.44, 256 tokens all but 0.08 of them.
  EXPECT_NEAR(expected_experts_touched(256, 8, 16), 101.96, 0.01);
  EXPECT_NEAR(expected_experts_touched(256, 8, 64), 222.44, 0.01);
  EXPECT_NEAR(expected_experts_touched(256, 8, 256), 255.92, 0.01);
  EXPECT_THROW(expected_experts_touched(256, 300, 1), Error);
}

// A batch that touches every expert reads every weight once: the checkpoint's payload, to the byte, for the
// BF16 and the block-FP8 fixtures (their vocabularies are smaller than the batch, so every embedding row
// too).
TEST(DecodeBound, ABatchTouchingEveryExpertReadsTheWholeCheckpoint) {
  for (const char* dir : {"small-moe-realdims", "small-moe-realdims-fp8"}) {
    const std::string path = std::string("tests/fixtures/models/") + dir;
    const auto cfg = ModelConfig::from_file(path + "/config.json");
    Precision p;
    p.weights = cfg.fp8 ? "fp8" : "bf16";
    ASSERT_LE(cfg.vocab_size, 4096) << dir;
    const DecodeStepBytes b = decode_step_bytes(cfg, p, 1, 4096, 0);
    EXPECT_DOUBLE_EQ(b.routed_experts + b.other_weights + b.lm_head,
                     safetensors_payload(path + "/model.safetensors"))
        << dir;
    EXPECT_EQ(b.kv, 0.0) << dir;  // no context
  }
}

// Qwen3.5-35B-A3B at batch 1: 8 of 256 experts a layer, the bf16 lm_head, two bf16 KV rows per attention
// layer and token, and the float32 GDN state read and written.
TEST(DecodeBound, Qwen35MoeBatchOneByKind) {
  const ModelConfig c = *model_preset("qwen3.5-35b-a3b");
  Precision bf16;
  const DecodeStepBytes b = decode_step_bytes(c, bf16, 1, 1, 1000);
  const double expert = 3.0 * 2048 * 512 * 2;  // gate, up, down
  EXPECT_DOUBLE_EQ(b.routed_experts, 40 * 8 * expert);
  EXPECT_DOUBLE_EQ(b.lm_head, double(c.vocab_size) * 2048 * 2);
  EXPECT_DOUBLE_EQ(b.kv, 10.0 * 2 * 2 * 256 * 2 * 1000);  // 10 layers x K and V x 2 heads x 256 x bf16
  const double state = 30.0 * (32 * 128 * 128 + 8192 * 3) * 4;
  EXPECT_DOUBLE_EQ(b.state, 2 * state);
  EXPECT_DOUBLE_EQ(b.seconds(4.8e12), b.total() / 4.8e12);

  Precision fp8 = bf16;
  fp8.weights = "fp8", fp8.state = "bf16", fp8.kv = "fp8";
  const DecodeStepBytes q = decode_step_bytes(c, fp8, 1, 1, 1000);
  // e4m3 codes and a float32 scale per 128 x 128 block; the lm_head stays bf16.
  EXPECT_DOUBLE_EQ(q.routed_experts, 40 * 8 * 3 * (2048.0 * 512 + 4.0 * 16 * 4));
  EXPECT_DOUBLE_EQ(q.lm_head, b.lm_head);
  EXPECT_DOUBLE_EQ(q.kv, b.kv / 2);
  EXPECT_DOUBLE_EQ(q.state, b.state / 2);

  // Two ranks of tensor parallelism each read half of every expert; the batch touches more of them.
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, bf16, 2, 1, 0).routed_experts, b.routed_experts / 2);
  EXPECT_NEAR(decode_step_bytes(c, bf16, 1, 64, 0).routed_experts / b.routed_experts, 222.44 / 8, 0.01);
}

}  // namespace
}  // namespace moeserve::deploy
