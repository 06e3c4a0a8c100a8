#pragma once
// CacheManager: owns the KV pages, the GDN state slots and the radix prefix cache, and hands running
// sequences their share (the scheduler decides who runs; this class decides which pages and slots they use).
//
// A sequence's life: start() gives it a live slot and its longest cached prefix — the prefix's pages are
// shared (ref-counted), a partially filled last page is copied so the sequence can write its next rows, and
// the cached GDN snapshot is copied into its live slot — then reserve() grows its page table as it computes,
// checkpoint() files what it computed so far (pages + a snapshot of its state) in the prefix cache, and
// finish() releases it, checkpointing everything first when asked. Page allocation evicts unlocked cached
// pages when the pool is dry; when even that is not enough the call returns false and the scheduler waits or
// preempts.

#include <cstdint>
#include <span>
#include <vector>

#include "cache/page_pool.h"
#include "cache/radix_cache.h"
#include "cache/slot_pool.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"

namespace moeserve {

// A running sequence's hold on the caches.
struct CacheSeq {
  std::vector<int32_t> pages;          // page table, one page-pool ref per entry
  int32_t slot = -1;                   // live state slot
  RadixCache::Node* locked = nullptr;  // the cached prefix it pins
  int64_t cached = 0;                  // prompt positions [0, cached) came from the prefix cache

  bool active() const { return slot >= 0; }
};

class CacheManager {
 public:
  // state.num_slots must be at least live_slots + snapshot_slots (slots past them are the caller's).
  CacheManager(const KvCacheSpec& kv, const StateCacheSpec& state, int live_slots, int snapshot_slots,
               bool prefix_cache);

  KvCache& kv() { return kv_; }
  // Another KV cache addressed by the same page tables (the MTP layer's): a hit's copied-on-write last page
  // is copied there too, so its rows are the cached ones, as in kv(). It must outlive this manager.
  void add_paged_cache(KvCache& cache) { paged_.push_back(&cache); }
  StateCache& state() { return state_; }
  int page_size() const { return kv_.spec().page_size; }
  bool prefix_cache_enabled() const { return prefix_cache_; }

  // What a start() would serve from the cache now (at most max_hit tokens), and how far the tree holds KV for
  // `tokens` (where a snapshot would extend the hit).
  RadixCache::Peek peek(std::span<const int32_t> tokens, int64_t max_hit) const;

  // Starts seq (which must be inactive) on `tokens`: a live slot, the cached prefix (at most max_hit tokens;
  // 0 disables the lookup) and pages for `extra` positions after it. False, holding nothing, when there is no
  // free live slot or not enough pages.
  bool start(CacheSeq& seq, std::span<const int32_t> tokens, int64_t max_hit, int64_t extra);
  // Grows seq's page table to cover `tokens` positions. False, with seq unchanged, when the pages cannot be
  // had.
  bool reserve(CacheSeq& seq, int64_t tokens);
  // Files tokens (all computed by seq, its live slot holding the state after the last one) in the prefix
  // cache with a snapshot of that state, and moves seq's lock there. Does nothing without snapshot slots.
  void checkpoint(CacheSeq& seq, std::span<const int32_t> tokens);
  // Releases everything seq holds; with keep, checkpoints `computed` first so a later request can resume
  // there.
  void finish(CacheSeq& seq, std::span<const int32_t> computed, bool keep);

  // Drops everything the prefix cache holds that no sequence pins.
  void flush() { radix_.flush(); }

  int64_t pages_total() const { return pool_.capacity(); }
  int64_t pages_free() const { return pool_.free_pages(); }
  int64_t pages_in_sequences() const { return seq_pages_; }  // distinct pages some running sequence holds
  int64_t pages_cached_only() const { return pool_.used_pages() - seq_pages_; }
  const SlotPool& slots() const { return slots_; }
  const RadixCache& radix() const { return radix_; }

  // For tests: throws moeserve::Error on any broken invariant of pages, slots and the tree; `running` must be
  // every active sequence.
  void check_invariants(std::span<const CacheSeq* const> running) const;

 private:
  bool allocate_pages(int64_t count, std::vector<int32_t>& out);
  void hold(int32_t page);     // count a page as held by a sequence
  void release(int32_t page);  // and back
  int32_t take_snapshot_slot();

  KvCache kv_;
  std::vector<KvCache*> paged_;  // add_paged_cache()
  StateCache state_;
  PagePool pool_;
  SlotPool slots_;
  RadixCache radix_;
  bool prefix_cache_;
  std::vector<int32_t> seq_refs_;  // per page: refs held by sequences (the rest are the tree's)
  int64_t seq_pages_ = 0;
};

}  // namespace moeserve
