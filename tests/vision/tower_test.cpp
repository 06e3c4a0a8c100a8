// The vision tower against the Hugging Face reference: every stage (patch embedding, the resampled
// positions, the rotary table, each block, the merged features) of each fixture image, alone and batched
// with the other image (attention must stay within one image).
#include "vision/tower.h"

#include <gtest/gtest.h>

#include <fstream>

#include "model/safetensors.h"
#include "reference.h"

namespace moeserve {
namespace {

using namespace moeserve::testing;

// float32 compute on both sides over the same bf16 weights: the differences are summation order only.
constexpr float kTolerance = 2e-4f;

class TowerTest : public ::testing::Test {
 protected:
  TowerTest()
      : config(*VisionConfig::from_dir(kVisionFixture)),
        weights(
            load_vision_weights(std::make_shared<TensorSet>(TensorSet::open_dir(kVisionFixture)), config)),
        backend(make_cpu_backend()),
        tower(weights, *backend) {
    auto processor = ImageProcessorConfig::from_dir(kVisionFixture);
    for (int i = 0; i < 2; ++i)
      images.push_back(preprocess_image(
          decode_image(file_bytes(kVisionFixture + "/image" + std::to_string(i) + ".png")), processor));
  }
  VisionReference ref;
  VisionConfig config;
  VisionWeights weights;
  std::unique_ptr<Backend> backend;
  VisionTower tower;
  std::vector<ImagePatches> images;
};

// Column range [0, half) of each row of a [rows][2·half] table.
std::vector<float> first_half(const std::vector<float>& table, size_t rows) {
  const size_t width = table.size() / rows, half = width / 2;
  std::vector<float> out;
  for (size_t r = 0; r < rows; ++r)
    out.insert(out.end(), table.begin() + long(r * width), table.begin() + long(r * width + half));
  return out;
}

TEST_F(TowerTest, ReadsTheFixturesVisionConfig) {
  EXPECT_EQ(config.depth, 2);
  EXPECT_EQ(config.hidden_size, 64);
  EXPECT_EQ(config.num_heads, 2);
  EXPECT_EQ(config.position_side(), 8);
  EXPECT_TRUE(config.gelu_tanh);
  EXPECT_EQ(config.image_token_id, 507);
  EXPECT_EQ(config.vision_start_token_id, 504);
  EXPECT_EQ(config.vision_end_token_id, 505);
}

TEST_F(TowerTest, EveryStageOfEachImageMatchesTheReference) {
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("image" + std::to_string(i));
    std::string key = "image" + std::to_string(i) + ".vision.";
    const ImagePatches* one[] = {&images[size_t(i)]};
    VisionTrace trace;
    std::vector<float> merged = tower.encode(one, &trace);
    const size_t rows = size_t(images[size_t(i)].patches());
    EXPECT_LT(max_abs_diff(trace.patch_embed, ref.floats(key + "patch_embed")), kTolerance);
    EXPECT_LT(max_abs_diff(trace.block_input, ref.floats(key + "block_input")), kTolerance);
    EXPECT_LT(max_abs_diff(trace.rotary_cos, first_half(ref.floats(key + "rotary_cos"), rows)), 1e-5f);
    EXPECT_LT(max_abs_diff(trace.rotary_sin, first_half(ref.floats(key + "rotary_sin"), rows)), 1e-5f);
    ASSERT_EQ(trace.blocks.size(), 2u);
    EXPECT_LT(max_abs_diff(trace.blocks[0], ref.floats(key + "block0")), kTolerance);
    EXPECT_LT(max_abs_diff(trace.blocks[1], ref.floats(key + "block1")), kTolerance);
    EXPECT_LT(max_abs_diff(merged, ref.floats(key + "merged")), kTolerance);
  }
}

TEST_F(TowerTest, ABatchOfImagesGivesEachImagesOwnFeatures) {
  const ImagePatches* both[] = {&images[1], &images[0]};
  std::vector<float> merged = tower.encode(both);
  std::vector<float> want = ref.floats("image1.vision.merged"), second = ref.floats("image0.vision.merged");
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_LT(max_abs_diff(merged, want), kTolerance);
}

// The engine's encoder cache hands an image the features it had in another step's batch: exact only if an
// image's features do not depend on the images encoded beside it. Bit for bit, not within a tolerance.
TEST_F(TowerTest, AnImagesFeaturesAreTheSameBitsAloneOrInABatch) {
  const ImagePatches* alone[] = {&images[0]};
  const ImagePatches* batch[] = {&images[1], &images[0]};
  const std::vector<float> one = tower.encode(alone), both = tower.encode(batch);
  ASSERT_EQ(both.size(), size_t((images[1].tokens(2) + images[0].tokens(2)) * config.out_hidden_size));
  const std::vector<float> second(both.end() - long(one.size()), both.end());
  EXPECT_EQ(std::memcmp(one.data(), second.data(), one.size() * sizeof(float)), 0);
}

TEST_F(TowerTest, MissingOrMisshapedTensorsAreNamed) {
  auto tensors = std::make_shared<TensorSet>(TensorSet::open_dir(kVisionFixture));
  VisionConfig wider = config;
  wider.intermediate_size = 96;
  try {
    load_vision_weights(tensors, wider);
    FAIL() << "loaded a mismatched tower";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.linear_fc1.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve
