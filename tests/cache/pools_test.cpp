#include <gtest/gtest.h>

#include "cache/page_pool.h"
#include "cache/slot_pool.h"

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

}  // namespace
}  // namespace moeserve
