#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cache/page_pool.h"
#include "cache/slot_pool.h"
#include "common/error.h"
#include "storage/state_cache.h"

namespace moeserve {
namespace {

TEST(PagePool, PageIsFreeAgainAfterItsLastHolderLetsGo) {
  PagePool pool(3);
  int32_t a = pool.allocate();
  ASSERT_GE(a, 0);
  EXPECT_EQ(pool.free_pages(), 2);
  pool.ref(a);
  EXPECT_EQ(pool.refcount(a), 2);
  EXPECT_FALSE(pool.unref(a));
  EXPECT_EQ(pool.free_pages(), 2);
  EXPECT_TRUE(pool.unref(a));
  EXPECT_EQ(pool.free_pages(), 3);
}

TEST(PagePool, AllocateReportsExhaustionInsteadOfFailing) {
  PagePool pool(2);
  EXPECT_GE(pool.allocate(), 0);
  EXPECT_GE(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.used_pages(), 2);
}

TEST(SlotPool, LiveAndSnapshotBudgetsAreSeparate) {
  SlotPool slots(2, 1);
  int32_t s = slots.allocate_snapshot();
  EXPECT_TRUE(slots.is_snapshot(s));
  EXPECT_EQ(slots.allocate_snapshot(), -1);  // the live slots are not lent to snapshots
  int32_t a = slots.allocate_live(), b = slots.allocate_live();
  EXPECT_TRUE(slots.is_live(a) && slots.is_live(b) && a != b);
  EXPECT_EQ(slots.allocate_live(), -1);
  slots.free_live(a);
  EXPECT_EQ(slots.live_free(), 1);
  EXPECT_EQ(slots.snapshot_used(), 1);
}

StateCacheSpec small_state(DType dtype, int slots = 3) {
  StateCacheSpec spec{2, 6, 4, 2, 3, 5, slots};  // 2 layers: conv 6 x 3, recurrent 2 x 3 x 5 floats each
  spec.dtype = dtype;
  return spec;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(StateCache, Bf16SlotsTakeHalfTheBytes) {
  EXPECT_EQ(small_state(DType::F32).bytes_per_slot(), 2 * (18 + 30) * 4);
  EXPECT_EQ(small_state(DType::BF16).bytes_per_slot(), 2 * (18 + 30) * 2);
}

TEST(StateCache, Bf16StoreRoundsToNearestAndLoadWidens) {
  StateCache cache(small_state(DType::BF16));
  ASSERT_FALSE(cache.is_f32());
  const auto conv = random_floats(18, 1), rec = random_floats(30, 2);
  cache.store(1, 2, conv.data(), rec.data());
  std::vector<float> c(18), r(30);
  cache.load(1, 2, c.data(), r.data());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], bf16_to_f32(f32_to_bf16(conv[i]))) << i;
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i], bf16_to_f32(f32_to_bf16(rec[i]))) << i;
    EXPECT_NEAR(r[i], rec[i], std::abs(rec[i]) / 256) << i;  // 8 significant bits
  }
  // Infinities stay infinite, a NaN stays a NaN (no rounding carries it into an infinity).
  std::vector<float> special(30, 1.0f);
  special[0] = INFINITY, special[1] = -INFINITY, special[2] = NAN, special[3] = 3.4e38f;  // the last rounds up
  cache.store(0, 0, conv.data(), special.data());
  cache.load(0, 0, c.data(), r.data());
  EXPECT_EQ(r[0], INFINITY);
  EXPECT_EQ(r[1], -INFINITY);
  EXPECT_TRUE(std::isnan(r[2]));
  EXPECT_EQ(r[3], bf16_to_f32(f32_to_bf16(3.4e38f)));
  EXPECT_EQ(r[4], 1.0f);
  cache.clear_slot(0);
  // Other layers and slots are untouched (zero).
  cache.load(0, 2, c.data(), r.data());
  EXPECT_EQ(r, std::vector<float>(30, 0.0f));
  cache.load(1, 1, c.data(), r.data());
  EXPECT_EQ(c, std::vector<float>(18, 0.0f));
}

TEST(StateCache, Bf16SnapshotsCopyTheRoundedBytesAndClearZeroes) {
  StateCache cache(small_state(DType::BF16));
  for (int layer = 0; layer < 2; ++layer) {
    const auto conv = random_floats(18, 10 + uint32_t(layer)), rec = random_floats(30, 20 + uint32_t(layer));
    cache.store(layer, 0, conv.data(), rec.data());
  }
  cache.copy_slot(0, 2);
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<float> c0(18), r0(30), c2(18), r2(30);
    cache.load(layer, 0, c0.data(), r0.data());
    cache.load(layer, 2, c2.data(), r2.data());
    EXPECT_EQ(c2, c0);
    EXPECT_EQ(r2, r0);
  }
  cache.clear_slot(0);
  std::vector<float> c(18), r(30);
  cache.load(1, 0, c.data(), r.data());
  EXPECT_EQ(c, std::vector<float>(18, 0.0f));
  EXPECT_EQ(r, std::vector<float>(30, 0.0f));
  cache.load(1, 2, c.data(), r.data());  // the copy survives
  EXPECT_NE(r, std::vector<float>(30, 0.0f));
}

// Device memory that is plain host memory underneath, to stand for a backend keeping the caches itself.
class HostCacheMemory : public CacheMemory {
 public:
  float* allocate_cache(size_t floats) override { return new float[floats](); }
  void free_cache(float* p) override { delete[] p; }
  void zero_cache(float* p, size_t floats) override { std::fill_n(p, floats, 0.0f); }
  void copy_cache(const float* src, float* dst, size_t floats) override { std::copy_n(src, floats, dst); }
};

TEST(StateCache, RefusesBf16OutsideHostMemoryAndOtherDtypes) {
  HostCacheMemory memory;
  StateCacheSpec spec = small_state(DType::BF16);
  spec.memory = &memory;
  EXPECT_THROW(StateCache{spec}, Error);
  spec.dtype = DType::F32;
  StateCache f32(spec);  // float32 in the backend's memory is fine
  EXPECT_TRUE(f32.is_f32());
  std::vector<float> c(18), r(30);
  EXPECT_THROW(f32.load(0, 0, c.data(), r.data()), Error);
  EXPECT_THROW(StateCache{small_state(DType::F16)}, Error);
}

}  // namespace
}  // namespace moeserve
