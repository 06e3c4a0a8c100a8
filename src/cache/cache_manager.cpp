#include "cache/cache_manager.h"

#include "common/error.h"

namespace moeserve {

CacheManager::CacheManager(const KvCacheSpec& kv, const StateCacheSpec& state, int live_slots,
                           int snapshot_slots, bool prefix_cache)
    : kv_(kv),
      state_(state),
      pool_(kv.num_pages),
      slots_(live_slots, snapshot_slots),
      radix_(pool_, slots_, kv.page_size),
      prefix_cache_(prefix_cache),
      seq_refs_(size_t(kv.num_pages), 0) {
  // Slots past these are the caller's (speculative decoding's trail slots).
  check(state.num_slots >= live_slots + snapshot_slots,
        "cache manager: state cache has {} slots, expected at least {} + {}", state.num_slots, live_slots,
        snapshot_slots);
}

RadixCache::Peek CacheManager::peek(std::span<const int32_t> tokens, int64_t max_hit) const {
  if (!prefix_cache_) return {};
  return radix_.peek(tokens, max_hit);
}

void CacheManager::hold(int32_t page) {
  if (seq_refs_[size_t(page)]++ == 0) ++seq_pages_;
}

void CacheManager::release(int32_t page) {
  if (--seq_refs_[size_t(page)] == 0) --seq_pages_;
  pool_.unref(page);
}

bool CacheManager::allocate_pages(int64_t count, std::vector<int32_t>& out) {
  if (count <= 0) return true;
  if (pool_.free_pages() < count) radix_.evict_pages(count - pool_.free_pages());
  if (pool_.free_pages() < count) return false;
  for (int64_t i = 0; i < count; ++i) {
    int32_t page = pool_.allocate();
    hold(page);
    out.push_back(page);
  }
  return true;
}

bool CacheManager::start(CacheSeq& seq, std::span<const int32_t> tokens, int64_t max_hit, int64_t extra) {
  check(!seq.active(), "cache manager: start of a sequence that is already running");
  int32_t slot = slots_.allocate_live();
  if (slot < 0) return false;

  RadixCache::Match m;
  if (prefix_cache_ && max_hit > 0)
    m = radix_.match(tokens, max_hit);
  else
    m.node = const_cast<RadixCache::Node*>(radix_.root());
  radix_.lock(m.node);  // before any allocation below can evict

  seq.slot = slot;
  seq.locked = m.node;
  seq.cached = m.length;
  seq.pages.clear();
  int rows = int(m.length % page_size());
  size_t shared = m.pages.size() - (rows != 0 ? 1 : 0);
  for (size_t i = 0; i < shared; ++i) {
    pool_.ref(m.pages[i]);
    hold(m.pages[i]);
    seq.pages.push_back(m.pages[i]);
  }
  if (rows != 0) {
    // The hit ends inside a page whose later rows may belong to another branch: write into a copy.
    if (!allocate_pages(1, seq.pages)) {
      finish(seq, {}, false);
      return false;
    }
    kv_.copy_page(m.pages.back(), seq.pages.back(), rows);
    for (KvCache* cache : paged_) cache->copy_page(m.pages.back(), seq.pages.back(), rows);
  }
  if (!reserve(seq, m.length + extra)) {
    finish(seq, {}, false);
    return false;
  }
  if (m.length > 0) state_.copy_slot(m.snapshot, slot);
  return true;
}

bool CacheManager::reserve(CacheSeq& seq, int64_t tokens) {
  int64_t need = (tokens + page_size() - 1) / page_size() - int64_t(seq.pages.size());
  return allocate_pages(need, seq.pages);
}

int32_t CacheManager::take_snapshot_slot() {
  int32_t slot = slots_.allocate_snapshot();
  while (slot < 0 && radix_.evict_snapshot()) slot = slots_.allocate_snapshot();
  return slot;
}

void CacheManager::checkpoint(CacheSeq& seq, std::span<const int32_t> tokens) {
  if (!prefix_cache_ || slots_.snapshot_total() == 0 || tokens.empty()) return;
  RadixCache::Node* node = radix_.insert(tokens, seq.pages);
  // Pin the new node before making room for its snapshot: evicting an old snapshot may remove unlocked
  // leaves.
  radix_.lock(node);
  radix_.unlock(seq.locked);
  seq.locked = node;
  if (node->snapshot >= 0) return;
  int32_t snap = take_snapshot_slot();
  if (snap < 0) return;
  state_.copy_slot(seq.slot, snap);
  radix_.set_snapshot(node, snap);
}

void CacheManager::finish(CacheSeq& seq, std::span<const int32_t> computed, bool keep) {
  if (!seq.active()) return;
  if (keep) checkpoint(seq, computed);
  for (int32_t page : seq.pages) release(page);
  seq.pages.clear();
  radix_.unlock(seq.locked);
  seq.locked = nullptr;
  slots_.free_live(seq.slot);
  seq.slot = -1;
  seq.cached = 0;
}

void CacheManager::check_invariants(std::span<const CacheSeq* const> running) const {
  radix_.check_invariants();
  std::vector<int32_t> refs(size_t(pool_.capacity()), 0);
  radix_.count_page_refs(refs);
  std::vector<int32_t> seq_refs(refs.size(), 0);
  for (const CacheSeq* s : running) {
    check(s->active() && slots_.is_live(s->slot), "cache manager: a running sequence has no live slot");
    for (int32_t p : s->pages) ++seq_refs[size_t(p)];
  }
  check(int(running.size()) == slots_.live_used(),
        "cache manager: {} running sequences, {} live slots in use", running.size(), slots_.live_used());
  int64_t used = 0;
  for (size_t p = 0; p < refs.size(); ++p) {
    check(seq_refs[p] == seq_refs_[p], "cache manager: page {} held {} times by sequences, counted {}", p,
          seq_refs[p], seq_refs_[p]);
    check(pool_.refcount(int32_t(p)) == refs[p] + seq_refs[p],
          "cache manager: page {} has refcount {}, but the tree holds {} and sequences {}", p,
          pool_.refcount(int32_t(p)), refs[p], seq_refs[p]);
    used += pool_.refcount(int32_t(p)) > 0;
  }
  check(used == pool_.used_pages(), "cache manager: {} pages referenced, pool says {} used", used,
        pool_.used_pages());
  check(radix_.snapshot_count() == slots_.snapshot_used(),
        "cache manager: tree holds {} snapshots, {} slots used", radix_.snapshot_count(),
        slots_.snapshot_used());
}

}  // namespace moeserve
