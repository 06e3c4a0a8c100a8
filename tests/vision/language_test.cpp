// Images in the language model against the Hugging Face reference: positions, embeddings after placement,
// logits of every position (one prefill, and chunks that split an image's tokens), greedy decoding with the
// image in context — the checks `moeserve verify` prints — and the placeholder and position rules on their
// own.
#include <gtest/gtest.h>

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "reference.h"
#include "vision/multimodal.h"
#include "vision/verify_vision.h"

namespace moeserve {
namespace {

using namespace moeserve::testing;

class LanguageModelWithImages : public ::testing::Test {
 protected:
  LanguageModelWithImages()
      : checkpoint(open_checkpoint(kVisionFixture)),
        vision(load_vision_weights(checkpoint.tensors, *VisionConfig::from_dir(kVisionFixture))),
        backend(make_cpu_backend()),
        model(checkpoint.weights, *backend) {}
  Checkpoint checkpoint;
  VisionWeights vision;
  std::unique_ptr<Backend> backend;
  Qwen35Model model;
};

TEST_F(LanguageModelWithImages, EveryStageMatchesTheReference) {
  auto reference = TensorSet::open_file(kVisionFixture + "/reference.safetensors");
  ASSERT_TRUE(is_vision_reference(reference));
  // Chunks of 16 split both images' tokens (spans [4, 74), [4, 76) and [81, 151)) across steps.
  auto report = verify_vision_reference(model, vision, ImageProcessorConfig::from_dir(kVisionFixture),
                                        kVisionFixture, reference, 1e-3, 16);
  std::vector<std::string> names;
  for (const auto& c : report.checks) {
    names.push_back(c.name);
    EXPECT_TRUE(c.ok) << c.name << ": " << c.max_abs_error << " > " << c.tolerance;
  }
  EXPECT_TRUE(report.passed);
  for (const char* want : {"image0 resized pixels", "image1 merged features", "prompt0 M-RoPE positions",
                           "prompt1 embeddings after placement", "prompt1 logits (chunks of 16)",
                           "gen0 greedy tokens", "gen1 step logits"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST_F(LanguageModelWithImages, TheFeaturesDecideTheLogits) {
  // The same prompt with zero features instead of the image's: the image tokens' logits move.
  VisionReference ref;
  std::vector<int64_t> ids64 = ref.ints("prompt0.input_ids");
  std::vector<int32_t> ids(ids64.begin(), ids64.end());
  const int64_t H = model.config().hidden_size;
  ImageGrid grid{7, 10};
  auto real = MultimodalPrompt::make(ids, 507, {&grid, 1}, ref.floats("image1.vision.merged"), H);
  auto blank = MultimodalPrompt::make(ids, 507, {&grid, 1}, std::vector<float>(size_t(70 * H), 0.0f), H);
  MultimodalSequence a(model, 100), b(model, 100);
  std::vector<float> want = ref.floats("prompt0.logits");
  EXPECT_LT(max_abs_diff(a.prefill(real, 86, true), want), 1e-3f);
  EXPECT_GT(max_abs_diff(b.prefill(blank, 86, true), want), 1e-2f);
}

TEST(ImagePlaceholders, EachBecomesItsImagesTokenCount) {
  const std::vector<int32_t> prompt = {1, 504, 507, 505, 2, 504, 507, 505, 3};
  const ImageGrid grids[] = {{2, 3}, {1, 2}};
  const std::vector<int32_t> want = {1, 504, 507, 507, 507, 507, 507, 507, 505, 2, 504, 507, 507, 505, 3};
  EXPECT_EQ(expand_image_placeholders(prompt, 507, grids), want);
  EXPECT_THROW(expand_image_placeholders(prompt, 507, std::span(grids, 1)), Error);
}

TEST(MropePositions, TextAfterAnImageContinuesAtItsLongerSide) {
  // Two text tokens, a 2x3 image, one text token: the image spans positions (2, 2..3, 2..4); text resumes
  // at 2 + max(2, 3) = 5, so rope_delta = 6 - 9 = -3.
  const std::vector<int32_t> tokens = {7, 8, 9, 9, 9, 9, 9, 9, 6};
  const ImageGrid grid{2, 3};
  auto p = MultimodalPrompt::make(tokens, 9, {&grid, 1}, std::vector<float>(6 * 4, 0.0f), 4);
  const std::vector<int64_t> want = {0, 1, 2, 2, 2, 2, 2, 2, 5,   // temporal
                                     0, 1, 2, 2, 2, 3, 3, 3, 5,   // height
                                     0, 1, 2, 3, 4, 2, 3, 4, 5};  // width
  EXPECT_EQ(p.positions, want);
  EXPECT_EQ(p.rope_delta, -3);
  EXPECT_EQ(p.image_rows, (std::vector<int32_t>{2, 3, 4, 5, 6, 7}));
  // A chunk that starts inside the image carries the rest of its features and positions.
  PromptChunk c = prompt_chunk(p, 4, 9);
  EXPECT_EQ(c.feature_rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(c.features.size(), 4u * 4u);
  EXPECT_EQ(c.positions, (std::vector<int64_t>{2, 2, 2, 2, 5, 2, 3, 3, 3, 5, 4, 2, 3, 4, 5}));
  EXPECT_THROW(MultimodalPrompt::make(tokens, 9, {}, {}, 4), Error);
}

}  // namespace
}  // namespace moeserve
