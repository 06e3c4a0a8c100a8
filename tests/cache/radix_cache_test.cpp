#include "cache/radix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

namespace moeserve {
namespace {

std::vector<int32_t> iota_tokens(int n, int first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

class RadixCacheTest : public ::testing::Test {
 protected:
  static constexpr int kPageSize = 4;
  PagePool pool{64};
  SlotPool slots{0, 8};
  RadixCache cache{pool, slots, kPageSize};

  // A sequence computed into fresh pages, filed with a snapshot at its end; returns the node.
  RadixCache::Node* add(const std::vector<int32_t>& tokens, bool snapshot = true) {
    std::vector<int32_t> pages;
    for (size_t i = 0; i < (tokens.size() + kPageSize - 1) / kPageSize; ++i) pages.push_back(pool.allocate());
    RadixCache::Node* node = cache.insert(tokens, pages);
    for (int32_t p : pages) pool.unref(p);  // the "sequence" is done; only the tree holds them now
    if (snapshot) {
      int32_t s = slots.allocate_snapshot();
      if (!cache.set_snapshot(node, s)) slots.free_snapshot(s);
    }
    cache.check_invariants();
    return node;
  }
};

TEST_F(RadixCacheTest, HitStopsAtDeepestStateSnapshot) {
  auto seq = iota_tokens(12);
  add({seq.begin(), seq.begin() + 5});
  add({seq.begin(), seq.begin() + 9}, /*snapshot=*/false);  // KV without a state: not a usable prefix
  auto m = cache.match(seq, int64_t(seq.size()) - 1);
  EXPECT_EQ(m.length, 5);
  EXPECT_EQ(m.kv_length, 9);
  EXPECT_EQ(m.pages.size(), 2u);
  EXPECT_GE(m.snapshot, 0);

  add({seq.begin(), seq.begin() + 11});
  EXPECT_EQ(cache.match(seq, 11).length, 11);
  EXPECT_EQ(cache.match(seq, 10).length, 5);  // the last prompt token is always computed
}

TEST_F(RadixCacheTest, NoSnapshotMeansNoHit) {
  auto seq = iota_tokens(8);
  add(seq, /*snapshot=*/false);
  auto m = cache.match(seq, 100);
  EXPECT_EQ(m.length, 0);
  EXPECT_EQ(m.node, cache.root());
  EXPECT_EQ(m.kv_length, 8);
}

TEST_F(RadixCacheTest, DivergingInsertSplitsNodeAndSharesBoundaryPage) {
  auto a = iota_tokens(10);
  auto b = a;
  b[6] = 100;  // diverges inside page 1 (positions 4..7)
  add(a);
  auto* na = cache.match(a, 10).node;
  std::vector<int32_t> a_pages = cache.match(a, 10).pages;
  add(b);
  EXPECT_EQ(cache.node_count(), 3);  // [0,6) shared, then two branches
  EXPECT_EQ(na->start, 6);
  // Page 1 is listed by the shared upper node and a's branch: two refs.
  EXPECT_EQ(pool.refcount(a_pages[1]), 2);
  // a's path still resolves to a's pages; b's path to b's own copy of page 1.
  EXPECT_EQ(cache.match(a, 10).pages, a_pages);
  auto mb = cache.match(b, 10);
  EXPECT_EQ(mb.length, 10);
  EXPECT_EQ(mb.pages[0], a_pages[0]);
  EXPECT_NE(mb.pages[1], a_pages[1]);
}

TEST_F(RadixCacheTest, InsertEndingInsideANodeSplitsItForTheSnapshot) {
  auto seq = iota_tokens(10);
  add(seq);
  auto* mid = add({seq.begin(), seq.begin() + 6});
  EXPECT_EQ(mid->end(), 6);
  EXPECT_GE(mid->snapshot, 0);
  EXPECT_EQ(cache.match(seq, 9).length, 6);
}

TEST_F(RadixCacheTest, ReinsertingTheSameTokensKeepsTheTreesPages) {
  auto seq = iota_tokens(8);
  add(seq);
  int64_t used = pool.used_pages();
  add(seq);  // a second sequence computed the same tokens into its own pages, which it then drops
  EXPECT_EQ(pool.used_pages(), used);
  EXPECT_EQ(cache.node_count(), 1);
  EXPECT_EQ(cache.snapshot_count(), 1);
  EXPECT_EQ(slots.snapshot_used(), 1);
}

TEST_F(RadixCacheTest, EvictionNeverTouchesLockedNodes) {
  auto a = iota_tokens(8), b = iota_tokens(8, 50);
  auto* na = add(a);
  add(b);
  cache.lock(na);
  int64_t freed = cache.evict_pages(1000);
  EXPECT_EQ(freed, 2);  // only b's pages
  EXPECT_EQ(cache.match(a, 8).length, 8);
  EXPECT_EQ(cache.match(b, 8).length, 0);
  cache.unlock(na);
  EXPECT_EQ(cache.evict_pages(1000), 2);
  EXPECT_EQ(pool.used_pages(), 0);
  cache.check_invariants();
}

TEST_F(RadixCacheTest, LockedAncestorsOfAnEvictedLeafStay) {
  auto seq = iota_tokens(12);
  auto* shorter = add({seq.begin(), seq.begin() + 4});
  add(seq);
  cache.lock(shorter);
  cache.evict_pages(1000);
  EXPECT_EQ(cache.node_count(), 1);
  EXPECT_EQ(cache.match(seq, 11).length, 4);
  cache.unlock(shorter);
}

TEST_F(RadixCacheTest, PageEvictionTakesSnapshotlessLeavesFirstThenLeastRecentlyUsed) {
  auto a = iota_tokens(4, 1), b = iota_tokens(4, 20), c = iota_tokens(4, 40);
  add(a);
  add(b);
  add(c, /*snapshot=*/false);
  cache.match(a, 4);  // a is now more recent than b
  EXPECT_EQ(cache.evict_pages(1), 1);
  EXPECT_EQ(cache.match(c, 4).kv_length, 0);  // c went first: it could never serve a hit
  EXPECT_EQ(cache.evict_pages(1), 1);
  EXPECT_EQ(cache.match(b, 4).length, 0);  // then the least recently used
  EXPECT_EQ(cache.match(a, 4).length, 4);
}

TEST_F(RadixCacheTest, SnapshotEvictionKeepsPagesOfInnerNodes) {
  auto seq = iota_tokens(12);
  auto* inner = add({seq.begin(), seq.begin() + 4});
  add(seq);
  cache.match(seq, 12);  // the deep snapshot is fresher
  ASSERT_TRUE(cache.evict_snapshot());
  EXPECT_LT(inner->snapshot, 0);
  EXPECT_EQ(cache.node_count(), 2);  // lost its state, kept its pages (the path to the deeper node)
  EXPECT_EQ(cache.match(seq, 12).length, 12);
  // Dropping the last snapshot leaves a snapshot-less leaf: it is removed with its ancestors.
  ASSERT_TRUE(cache.evict_snapshot());
  EXPECT_EQ(cache.node_count(), 0);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_FALSE(cache.evict_snapshot());
  cache.check_invariants();
}

TEST_F(RadixCacheTest, SnapshotOfALockedNodeMayGoButItsPagesStay) {
  auto seq = iota_tokens(8);
  auto* n = add(seq);
  cache.lock(n);
  ASSERT_TRUE(cache.evict_snapshot());
  EXPECT_EQ(cache.node_count(), 1);
  EXPECT_EQ(cache.evict_pages(100), 0);
  cache.unlock(n);
  EXPECT_EQ(cache.evict_pages(100), 2);
}

TEST_F(RadixCacheTest, FlushFreesEverythingUnlocked) {
  add(iota_tokens(9));
  add(iota_tokens(5, 30));
  cache.flush();
  EXPECT_EQ(cache.node_count(), 0);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(slots.snapshot_used(), 0);
}

}  // namespace
}  // namespace moeserve
