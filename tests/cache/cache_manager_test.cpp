#include "cache/cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace moeserve {
namespace {

// A stand-in for the model: position p of a sequence stores its token in the KV page, and a state slot stores
// (tokens seen, hash of them). Reading them back tells whether pages and snapshots hold what they claim.
class Simulator {
 public:
  Simulator(int page_size, int64_t pages, int live, int snapshots)
      : cm(KvCacheSpec{1, 1, 1, page_size, pages}, StateCacheSpec{1, 2, 2, 1, 1, 1, live + snapshots}, live,
           snapshots, true),
        page_size_(page_size) {}

  static float hash(std::span<const int32_t> tokens) {
    int64_t h = 7;
    for (int32_t t : tokens) h = (h * 31 + t + 1) % 1000003;
    return float(h);
  }

  void write(CacheSeq& s, int64_t pos, int32_t token) {
    ASSERT_LT(size_t(pos / page_size_), s.pages.size());
    cm.kv().keys(0, s.pages[size_t(pos / page_size_)])[pos % page_size_] = float(token);
  }
  float read(const CacheSeq& s, int64_t pos) {
    return cm.kv().keys(0, s.pages[size_t(pos / page_size_)])[pos % page_size_];
  }
  void set_state(const CacheSeq& s, std::span<const int32_t> tokens) {
    cm.state().conv(0, s.slot)[0] = float(tokens.size());
    cm.state().conv(0, s.slot)[1] = hash(tokens);
  }

  // Checks that seq's view of [0, cached) and its starting state are those of `tokens`.
  void expect_prefix_intact(const CacheSeq& s, const std::vector<int32_t>& tokens) {
    for (int64_t p = 0; p < s.cached; ++p)
      ASSERT_EQ(read(s, p), float(tokens[size_t(p)])) << "position " << p;
    if (s.cached > 0) {
      ASSERT_EQ(cm.state().conv(0, s.slot)[0], float(s.cached));
      ASSERT_EQ(cm.state().conv(0, s.slot)[1], hash({tokens.data(), size_t(s.cached)}));
    }
  }

  CacheManager cm;

 private:
  int page_size_;
};

struct Running {
  CacheSeq seq;
  std::vector<int32_t> tokens;
  int64_t computed = 0;
};

void check_all(Simulator& sim, const std::vector<std::unique_ptr<Running>>& running) {
  std::vector<const CacheSeq*> seqs;
  for (auto& r : running) seqs.push_back(&r->seq);
  sim.cm.check_invariants(seqs);
}

TEST(CacheManager, HitCopiesPartialPageAndRestoresSnapshot) {
  Simulator sim(4, 16, 2, 2);
  std::vector<int32_t> turn1 = {5, 6, 7, 8, 9, 10};
  CacheSeq a;
  ASSERT_TRUE(sim.cm.start(a, turn1, 5, 6));  // no hit: 6 positions
  for (int p = 0; p < 6; ++p) sim.write(a, p, turn1[size_t(p)]);
  sim.set_state(a, turn1);
  sim.cm.finish(a, turn1, /*keep=*/true);

  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), {11, 12, 13});
  CacheSeq b;
  ASSERT_TRUE(sim.cm.start(b, turn2, 8, 3));
  EXPECT_EQ(b.cached, 6);
  sim.expect_prefix_intact(b, turn2);
  // Position 6 shares page 1 with the cached positions 4, 5: b must own a copy before writing there.
  const auto& cached_pages = sim.cm.radix().root()->children.begin()->second->pages;
  EXPECT_NE(cached_pages[1], b.pages[1]);
  EXPECT_EQ(cached_pages[0], b.pages[0]);  // full pages are shared
  std::vector<const CacheSeq*> running{&b};
  sim.cm.check_invariants(running);
  sim.cm.finish(b, {}, false);
  sim.cm.flush();
  EXPECT_EQ(sim.cm.pages_free(), sim.cm.pages_total());
}

// A KV cache addressed by the same page tables (the MTP layer's) follows the copy-on-write of a hit's partial
// last page: the copy holds the cached rows there too.
TEST(CacheManager, HitCopiesThePartialPageOfAPagedCacheToo) {
  Simulator sim(4, 16, 2, 2);
  KvCache mtp(KvCacheSpec{1, 1, 1, 4, 16});
  sim.cm.add_paged_cache(mtp);
  std::vector<int32_t> turn1 = {5, 6, 7, 8, 9, 10};
  CacheSeq a;
  ASSERT_TRUE(sim.cm.start(a, turn1, 5, 6));
  for (int p = 0; p < 6; ++p) {
    sim.write(a, p, turn1[size_t(p)]);
    mtp.keys(0, a.pages[size_t(p / 4)])[p % 4] = float(100 + turn1[size_t(p)]);
  }
  sim.set_state(a, turn1);
  sim.cm.finish(a, turn1, /*keep=*/true);

  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), {11, 12, 13});
  CacheSeq b;
  ASSERT_TRUE(sim.cm.start(b, turn2, 8, 3));
  ASSERT_EQ(b.cached, 6);
  const auto& cached_pages = sim.cm.radix().root()->children.begin()->second->pages;
  ASSERT_NE(cached_pages[1], b.pages[1]);
  for (int p = 0; p < 6; ++p)
    EXPECT_EQ(mtp.keys(0, b.pages[size_t(p / 4)])[p % 4], float(100 + turn2[size_t(p)])) << "position " << p;
  sim.cm.finish(b, {}, false);
}

TEST(CacheManager, FullCacheDegradesToRecomputation) {
  Simulator sim(2, 4, 2, 4);  // 8 tokens of KV
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  CacheSeq s;
  ASSERT_TRUE(sim.cm.start(s, a, 7, 8));
  sim.cm.finish(s, a, true);  // the cache now holds every page
  EXPECT_EQ(sim.cm.pages_free(), 0);
  std::vector<int32_t> b = {9, 9, 9, 9, 9, 9};
  CacheSeq t;
  ASSERT_TRUE(sim.cm.start(t, b, 5, 6));  // evicts the cached sequence instead of failing
  EXPECT_EQ(t.cached, 0);
  CacheSeq u;
  EXPECT_FALSE(sim.cm.start(u, a, 7, 8));  // t's pages are pinned: not enough, and nothing leaks
  EXPECT_FALSE(u.active());
  std::vector<const CacheSeq*> running{&t};
  sim.cm.check_invariants(running);
}

// Random starts, chunked computation, checkpoints, decodes and finishes against the simulator. With room for
// everything (no eviction) every hit must be exactly the longest checkpointed prefix; under pressure every
// hit must still read back the right tokens and state, and the books must balance after every operation.
void soak(int page_size, int64_t pages, int live, int snapshots, bool exact, int ops, uint32_t seed) {
  Simulator sim(page_size, pages, live, snapshots);
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> families(4);
  for (auto& f : families)
    for (int i = 0; i < 40; ++i) f.push_back(uniform(0, 7));
  std::set<std::vector<int32_t>> checkpointed;
  std::vector<std::unique_ptr<Running>> running;

  auto checkpoint = [&](Running& r) {
    std::span<const int32_t> done(r.tokens.data(), size_t(r.computed));
    sim.cm.checkpoint(r.seq, done);
    checkpointed.emplace(done.begin(), done.end());
  };

  int64_t hits = 0, evicting_starts = 0;
  for (int op = 0; op < ops; ++op) {
    int kind = uniform(0, 9);
    if (kind <= 3 && int(running.size()) < live) {
      auto r = std::make_unique<Running>();
      const auto& f = families[size_t(uniform(0, 3))];
      r->tokens.assign(f.begin(), f.begin() + uniform(0, 40));
      for (int i = uniform(r->tokens.empty() ? 1 : 0, 6); i > 0; --i) r->tokens.push_back(uniform(0, 7));
      int64_t n = int64_t(r->tokens.size());
      evicting_starts += sim.cm.pages_free() < (n + page_size - 1) / page_size;
      if (!sim.cm.start(r->seq, r->tokens, n - 1, n - sim.cm.peek(r->tokens, n - 1).length)) {
        ASSERT_FALSE(exact) << "start failed with room to spare";
        ASSERT_FALSE(r->seq.active());
        check_all(sim, running);
        continue;
      }
      if (exact) {
        int64_t want = 0;
        for (int64_t k = 1; k < n; ++k)
          if (checkpointed.count({r->tokens.begin(), r->tokens.begin() + k})) want = k;
        ASSERT_EQ(r->seq.cached, want) << "op " << op;
      }
      sim.expect_prefix_intact(r->seq, r->tokens);
      hits += r->seq.cached > 0;
      r->computed = r->seq.cached;
      while (r->computed < n) {  // chunked prefill, a checkpoint at some chunk ends
        int64_t end = std::min<int64_t>(n, r->computed + uniform(1, 9));
        for (int64_t p = r->computed; p < end; ++p) sim.write(r->seq, p, r->tokens[size_t(p)]);
        r->computed = end;
        sim.set_state(r->seq, {r->tokens.data(), size_t(end)});
        if (uniform(0, 1)) checkpoint(*r);
      }
      running.push_back(std::move(r));
    } else if (kind <= 6 && !running.empty()) {  // decode one token
      Running& r = *running[size_t(uniform(0, int(running.size()) - 1))];
      if (!sim.cm.reserve(r.seq, r.computed + 1)) {
        ASSERT_FALSE(exact);
        continue;
      }
      r.tokens.push_back(uniform(0, 7));
      sim.write(r.seq, r.computed, r.tokens.back());
      ++r.computed;
      sim.set_state(r.seq, r.tokens);
      if (uniform(0, 4) == 0) checkpoint(r);
    } else if (kind <= 8 && !running.empty()) {
      size_t i = size_t(uniform(0, int(running.size()) - 1));
      Running& r = *running[i];
      bool keep = uniform(0, 3) != 0;
      sim.cm.finish(r.seq, {r.tokens.data(), size_t(r.computed)}, keep);
      if (keep && snapshots > 0) checkpointed.emplace(r.tokens.begin(), r.tokens.begin() + r.computed);
      running.erase(running.begin() + int64_t(i));
    } else if (!exact && uniform(0, 20) == 0) {
      sim.cm.flush();
    }
    check_all(sim, running);
  }
  EXPECT_GT(hits, ops / 50);  // the workload does exercise the cache
  if (!exact) {
    EXPECT_GT(evicting_starts, ops / 20);
  }
  for (auto& r : running) sim.cm.finish(r->seq, {r->tokens.data(), size_t(r->computed)}, true);
  running.clear();
  check_all(sim, running);
  EXPECT_EQ(sim.cm.pages_in_sequences(), 0);
  sim.cm.flush();
  EXPECT_EQ(sim.cm.pages_free(), sim.cm.pages_total());
  EXPECT_EQ(sim.cm.slots().snapshot_used(), 0);
}

TEST(CacheManager, RandomOpsMatchNaiveModelWithoutEviction) {
  for (int page_size : {1, 3, 4}) {
    SCOPED_TRACE(page_size);
    soak(page_size, 1 << 13, 6, 1 << 12, /*exact=*/true, 1500, 42u + uint32_t(page_size));
  }
}

TEST(CacheManager, RandomOpsUnderMemoryPressureKeepEveryInvariant) {
  for (int page_size : {1, 3, 4}) {
    SCOPED_TRACE(page_size);
    soak(page_size, 40 / page_size + 8, 4, 3, /*exact=*/false, 3000, 7u + uint32_t(page_size));
  }
}

}  // namespace
}  // namespace moeserve
