// init-model --vision: a random checkpoint of the real ForConditionalGeneration layout that every part of the
// image path loads and runs: the text model under model.language_model., the tower under model.visual., the
// nested config with vision_config and the vision token ids (the tokenizer's own with --vocab-from).
#include "model/init_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../model/test_util.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "reference.h"
#include "vision/multimodal.h"
#include "vision/tower.h"

namespace moeserve {
namespace {

using namespace moeserve::testing;

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

TEST(InitModelVision, TheTinyPresetLoadsEncodesAndRunsAnImagePrompt) {
  TempDir dir;
  InitModelOptions options;
  options.vision = true;
  init_model(preset_config("tiny"), dir.path(), options);

  Checkpoint ck = open_checkpoint(dir.path());
  EXPECT_EQ(ck.vision_tensors.size(), 33u);  // the fixture's tower: 3 + 2 blocks x 12 + 6
  EXPECT_FALSE(ck.weights.config.mrope_section.empty());
  auto config = VisionConfig::from_dir(dir.path());
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->out_hidden_size, ck.weights.config.hidden_size);
  EXPECT_EQ(config->image_token_id, 507);  // the last ids of a 512-token vocabulary, as in the fixture
  EXPECT_EQ(config->vision_start_token_id, 504);
  VisionWeights vision = load_vision_weights(ck.tensors, *config);

  auto backend = make_cpu_backend();
  VisionTower tower(vision, *backend);
  ImagePatches img = preprocess_image(decode_image(file_bytes(kVisionFixture + "/image1.png")), {});
  const ImagePatches* one[] = {&img};
  std::vector<float> features = tower.encode(one);
  ASSERT_EQ(features.size(), size_t(70 * ck.weights.config.hidden_size));
  EXPECT_TRUE(all_finite(features));

  Qwen35Model model(ck.weights, *backend);
  std::vector<int32_t> tokens = {1, 504, 507, 505, 9, 10};
  ImageGrid grid{img.grid_h / 2, img.grid_w / 2};
  auto prompt = MultimodalPrompt::make(expand_image_placeholders(tokens, 507, {&grid, 1}), 507, {&grid, 1},
                                       features, ck.weights.config.hidden_size);
  MultimodalSequence seq(model, 100);
  std::vector<float> logits = seq.prefill(prompt, 32, false);
  EXPECT_TRUE(all_finite(logits));
  EXPECT_TRUE(all_finite(seq.decode(3)));
}

TEST(InitModelVision, VocabFromATokenizerTakesItsVisionTokenIds) {
  TempDir dir;
  InitModelOptions options;
  options.vision = true;
  options.vocab_from = ".cache/tokenizer-qwen3/tokenizer.json";  // scripts/fetch-test-data.sh
  init_model(preset_config("tiny"), dir.path(), options);
  auto config = VisionConfig::from_dir(dir.path());
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->vision_start_token_id, 151652);
  EXPECT_EQ(config->vision_end_token_id, 151653);
  EXPECT_EQ(config->image_token_id, 151655);
  EXPECT_NO_THROW(open_checkpoint(dir.path()));
}

// --load-format dummy --preset 35b-a3b (docs/vision.md): the release tower's shape with the text model's
// width at the merger, Qwen3.5's vision token ids without a tokenizer, the tokenizer's with one.
TEST(InitModelVision, DummyTowerOfTheFullSizePresetHasTheReleaseShape) {
  const ModelConfig text = preset_config("35b-a3b");
  const VisionShape shape = default_vision_shape(text);
  auto config = VisionConfig::from_json(dummy_vision_config(text, {}, shape));
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->depth, 27);
  EXPECT_EQ(config->hidden_size, 1152);
  EXPECT_EQ(config->intermediate_size, 4304);
  EXPECT_EQ(config->num_heads, 16);
  EXPECT_EQ(config->head_dim(), 72);
  EXPECT_EQ(config->position_side(), 48);
  EXPECT_EQ(config->patch_size, 16);
  EXPECT_EQ(config->temporal_patch_size, 2);
  EXPECT_EQ(config->spatial_merge_size, 2);
  EXPECT_EQ(config->out_hidden_size, 2048);
  EXPECT_EQ(config->image_token_id, 248056);
  EXPECT_EQ(config->vision_start_token_id, 248053);
  auto with_tokenizer = VisionConfig::from_json(dummy_vision_config(text,
                                                                    {{"<|vision_start|>", 151652},
                                                                     {"<|vision_end|>", 151653},
                                                                     {"<|image_pad|>", 151655},
                                                                     {"<|video_pad|>", 151656}},
                                                                    shape));
  EXPECT_EQ(with_tokenizer->image_token_id, 151655);
  const VisionShape tiny = default_vision_shape(preset_config("tiny"));
  EXPECT_EQ(tiny.depth, 2);
  EXPECT_EQ(tiny.hidden, 64);
}

// The random tower at the release's width (one block of it, to keep the test's memory small) loads and
// encodes: every tensor of the shape is there, and the features are the text model's width.
TEST(InitModelVision, DummyTowerAtTheReleaseWidthLoadsAndEncodes) {
  const ModelConfig text = preset_config("35b-a3b");
  VisionShape shape = default_vision_shape(text);
  shape.depth = 1;
  DummyVision dummy = make_dummy_vision(text, 5, {}, shape);
  auto config = VisionConfig::from_json(dummy.config);
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->depth, 1);
  VisionWeights vision = load_vision_weights(dummy.tensors, *config);
  auto backend = make_cpu_backend();
  VisionTower tower(vision, *backend);
  ImagePatches img = preprocess_image(decode_image(file_bytes(kVisionFixture + "/image1.png")), {});
  const ImagePatches* one[] = {&img};
  std::vector<float> features = tower.encode(one);
  ASSERT_EQ(features.size(), size_t(70 * 2048));
  EXPECT_TRUE(all_finite(features));
}

}  // namespace
}  // namespace moeserve
