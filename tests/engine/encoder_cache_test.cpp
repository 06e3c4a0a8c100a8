// The encoder cache's rules (engine/encoder_cache.h): an image is found by its content hash and grid only,
// the features come back as they went in, and the byte bound evicts the least recently used first. The
// engine's use of it (the tower skipped, output unchanged) is tested end to end in
// tests/server/serve_vision_test.cpp.
#include "engine/encoder_cache.h"

#include <gtest/gtest.h>

#include "engine/engine.h"

namespace moeserve {
namespace {

PromptImage image(uint64_t content, int grid_h = 4, int grid_w = 6) {
  PromptImage p;
  p.hash = {content, ~content};
  p.patches.grid_t = 1;
  p.patches.grid_h = grid_h;
  p.patches.grid_w = grid_w;
  return p;
}

EncoderCache::Features features(size_t floats, float first) {
  auto f = std::make_shared<std::vector<float>>(floats);
  for (size_t i = 0; i < floats; ++i) (*f)[i] = first + float(i);
  return f;
}

TEST(EncoderCache, TheSameImageHitsWithItsOwnFeaturesAndAnotherNever) {
  EncoderCache cache(1 << 20);
  auto a = features(100, 1.5f);
  cache.insert(image(1), a);
  auto found = cache.find(image(1));
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(*found, *a);
  EXPECT_EQ(cache.find(image(2)), nullptr) << "another picture";
  PromptImage half = image(1);
  half.hash[1] ^= 1;
  EXPECT_EQ(cache.find(half), nullptr) << "all 128 bits of the hash decide";
  EXPECT_EQ(cache.find(image(1, 4, 8)), nullptr) << "the same picture resized to another grid";
  EXPECT_EQ(cache.bytes(), 100 * sizeof(float));
}

TEST(EncoderCache, TheByteBoundEvictsTheLeastRecentlyUsed) {
  constexpr size_t kFloats = 256;  // 1 KiB an image
  EncoderCache cache(3 * kFloats * sizeof(float));
  for (uint64_t k = 1; k <= 3; ++k) cache.insert(image(k), features(kFloats, float(k)));
  EXPECT_EQ(cache.entries(), 3u);
  ASSERT_NE(cache.find(image(1)), nullptr);  // 1 is now the most recent; 2 the least
  cache.insert(image(4), features(kFloats, 4));
  EXPECT_EQ(cache.entries(), 3u);
  EXPECT_EQ(cache.bytes(), 3 * kFloats * sizeof(float));
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(cache.find(image(2)), nullptr);
  for (uint64_t k : {1, 3, 4}) EXPECT_NE(cache.find(image(k)), nullptr) << k;
  // One image twice the size makes room by evicting two.
  cache.insert(image(5), features(2 * kFloats, 5));
  EXPECT_LE(cache.bytes(), 3 * kFloats * sizeof(float));
  EXPECT_NE(cache.find(image(5)), nullptr);
  EXPECT_EQ(cache.evictions(), 3u);
}

TEST(EncoderCache, FeaturesOverTheBoundOrABoundOfZeroAreNotKept) {
  EncoderCache small(1000);
  small.insert(image(1), features(1000, 0));  // 4,000 bytes
  EXPECT_EQ(small.find(image(1)), nullptr);
  EXPECT_EQ(small.bytes(), 0u);
  EncoderCache off(0);
  off.insert(image(2), features(1, 0));
  EXPECT_EQ(off.find(image(2)), nullptr);
}

}  // namespace
}  // namespace moeserve
