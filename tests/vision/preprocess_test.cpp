// Qwen's image processor against the Hugging Face reference: decoded pixels, the smart_resize target, the
// bicubic antialiased resize (torch's uint8 arithmetic, exactly), pixel_values and the grid.
#include "vision/preprocess.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "reference.h"

namespace moeserve {
namespace {

using namespace moeserve::testing;

class ReferenceImage : public ::testing::TestWithParam<int> {
 protected:
  std::string key() const { return "image" + std::to_string(GetParam()); }
  Image decoded() const { return decode_image(file_bytes(kVisionFixture + "/" + key() + ".png")); }
  VisionReference ref;
};

TEST_P(ReferenceImage, DecodesToThePixelsPilDecodes) {
  Image img = decoded();
  const TensorInfo& rgb = ref.info(key() + ".rgb");
  ASSERT_EQ(img.height, rgb.shape[0]);
  ASSERT_EQ(img.width, rgb.shape[1]);
  EXPECT_EQ(img.rgb, ref.bytes(key() + ".rgb"));
}

TEST_P(ReferenceImage, ResizesExactlyAsTorchDoes) {
  Image img = decoded();
  const TensorInfo& resized = ref.info(key() + ".resized");
  auto [h, w] = smart_resize(img.height, img.width, 32, 65'536, 16'777'216);
  ASSERT_EQ(h, resized.shape[1]);
  ASSERT_EQ(w, resized.shape[2]);
  PlanarImage out = resize_bicubic(img, h, w);
  std::vector<uint8_t> want = ref.bytes(key() + ".resized");
  ASSERT_EQ(out.planes.size(), want.size());
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(int(out.planes[i]) - int(want[i])));
  EXPECT_EQ(worst, 0) << "levels off at worst";
}

TEST_P(ReferenceImage, PixelValuesAndGridAreTheProcessors) {
  auto config = ImageProcessorConfig::from_dir(kVisionFixture);
  ImagePatches patches = preprocess_image(decoded(), config);
  std::vector<int64_t> grid = ref.ints(key() + ".grid_thw");
  EXPECT_EQ(patches.grid_t, grid[0]);
  EXPECT_EQ(patches.grid_h, grid[1]);
  EXPECT_EQ(patches.grid_w, grid[2]);
  EXPECT_EQ(max_abs_diff(patches.pixel_values, ref.floats(key() + ".pixel_values")), 0.0f);
  auto meta = nlohmann::json::parse(std::ifstream(kVisionFixture + "/reference.json"));
  EXPECT_EQ(patches.tokens(config.merge_size), meta["images"][GetParam()]["image_tokens"].get<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(Fixture, ReferenceImage, ::testing::Values(0, 1));

TEST(SmartResize, RoundsHalfToEvenAsPython) {
  // 208/32 = 6.5 rounds to 6 (Python), not 7 (C's round); 80/32 = 2.5 rounds to 2; 112/32 = 3.5 to 4.
  EXPECT_EQ(smart_resize(208, 4000, 32, 1, 1 << 30).first, 192);
  EXPECT_EQ(smart_resize(80, 8000, 32, 1, 1 << 30).first, 64);
  EXPECT_EQ(smart_resize(112, 8000, 32, 1, 1 << 30).first, 128);
}

TEST(SmartResize, KeepsThePixelCountWithinTheBounds) {
  // Too small: scaled up past min_pixels; too large: scaled down below max_pixels; both multiples of 32.
  auto [h1, w1] = smart_resize(10, 15, 32, 65'536, 16'777'216);
  EXPECT_EQ(h1, 224);  // ceil(10 * sqrt(65536 / 150) / 32) * 32
  EXPECT_EQ(w1, 320);
  auto [h2, w2] = smart_resize(10'000, 5'000, 32, 65'536, 1'000'000);
  EXPECT_LE(int64_t(h2) * w2, 1'000'000);
  EXPECT_EQ(h2 % 32, 0);
  EXPECT_EQ(w2 % 32, 0);
  EXPECT_EQ(h2, 1408);  // floor(10000 / sqrt(50) / 32) * 32
  EXPECT_EQ(w2, 704);
}

TEST(SmartResize, RefusesExtremeAspectRatios) {
  EXPECT_THROW(smart_resize(1, 201, 32, 1, 1 << 30), ImageError);
  EXPECT_NO_THROW(smart_resize(1, 200, 32, 1, 1 << 30));
}

TEST(ImageProcessorConfig, ReadsTheReleaseFieldsAndRefusesBadOnes) {
  auto c = ImageProcessorConfig::from_json(nlohmann::json::parse(
      R"({"size": {"shortest_edge": 3136, "longest_edge": 1003520}, "patch_size": 14, "merge_size": 2,
          "image_mean": [0.48, 0.45, 0.40], "image_std": [0.26, 0.26, 0.27]})"));
  EXPECT_EQ(c.min_pixels, 3136);
  EXPECT_EQ(c.max_pixels, 1003520);
  EXPECT_EQ(c.factor(), 28);
  EXPECT_DOUBLE_EQ(c.std[2], 0.27);
  EXPECT_THROW(ImageProcessorConfig::from_json(nlohmann::json::parse(R"({"patch_size": 0})")), Error);
  EXPECT_THROW(ImageProcessorConfig::from_json(nlohmann::json::parse(R"({"image_std": [1, 0, 1]})")), Error);
  EXPECT_THROW(ImageProcessorConfig::from_json(
                   nlohmann::json::parse(R"({"size": {"shortest_edge": 9, "longest_edge": 4}})")),
               Error);
}

}  // namespace
}  // namespace moeserve
