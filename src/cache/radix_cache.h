#pragma once
// RadixCache: a prefix cache over token ids for a hybrid attention + Gated-DeltaNet model.
//
// A radix tree whose edges are token runs. A node covering positions [start, end) holds the KV pages of those
// positions (one page-pool ref each) and, optionally, a snapshot: a state slot with the GDN state after all
// `end` tokens of its path. A prefix is only reusable where such a snapshot exists — the recurrent state
// cannot be rebuilt from the KV — so match() returns the longest prefix ending at a node with a snapshot.
//
// Pages are indexed by position / page_size, so a node boundary can fall inside a page. Such a boundary page
// is listed by both nodes: by the upper one as the page holding its last rows and by the lower one as the
// page its path continues in (the same page when one sequence wrote both, a copy-on-write copy when a second
// sequence branched there). Along any path, the deepest node listing a page index has the right rows for the
// whole path, and a reader that extends a path ending mid-page copies that page before writing (see
// CacheManager).
//
// Locks pin a node and its ancestors while a running sequence uses their pages; eviction never touches a
// locked node. Two independent LRU evictions: evict_pages() removes unlocked leaves (snapshot-less ones
// first, their pages serve nobody), evict_snapshot() drops the least recently used snapshot, whether or not
// its node is locked (a running sequence copies the snapshot into its own slot when it starts, so it no
// longer needs it).

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "cache/page_pool.h"
#include "cache/slot_pool.h"

namespace moeserve {

class RadixCache {
 public:
  struct Node {
    std::vector<int32_t> tokens;  // the edge: positions [start, start + tokens.size())
    std::vector<int32_t> pages;   // page indices [start / page_size, ceil(end / page_size))
    int64_t start = 0;
    Node* parent = nullptr;
    std::map<int32_t, std::unique_ptr<Node>> children;  // keyed by their first token
    int lock = 0;                  // sequences whose locked prefix passes through or ends here
    uint64_t access = 0;           // logical time of the last hit or insert through here (page LRU)
    int32_t snapshot = -1;         // state slot after the `end()` tokens of this path, or -1
    uint64_t snapshot_access = 0;  // logical time the snapshot was taken or last served a hit (snapshot LRU)

    int64_t end() const { return start + int64_t(tokens.size()); }
  };

  struct Match {
    Node* node = nullptr;        // the node the hit ends at (the root for no hit): lock it while using pages
    int64_t length = 0;          // tokens served: node->end(), 0 for no hit
    int32_t snapshot = -1;       // node->snapshot (-1 iff length == 0)
    std::vector<int32_t> pages;  // page table of [0, length); no refs taken
    int64_t kv_length = 0;       // tokens of the query the tree holds KV for, snapshot or not (>= length)
  };

  RadixCache(PagePool& pages, SlotPool& slots, int page_size);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The longest prefix of `tokens`, at most max_length long, that ends at a node with a snapshot. Marks the
  // path and the snapshot as recently used.
  Match match(std::span<const int32_t> tokens, int64_t max_length);
  // match(...)'s length and kv_length without side effects (for scheduling decisions).
  struct Peek {
    int64_t length = 0;
    int64_t kv_length = 0;
  };
  Peek peek(std::span<const int32_t> tokens, int64_t max_length) const;

  void lock(Node* node);
  void unlock(Node* node);

  // Records that tokens[0, n) have their KV in `page_table` (covering ceil(n / page_size) pages). Parts
  // already in the tree keep the tree's pages; new parts take a ref on the caller's pages. Returns the node
  // ending at n, splitting one if n falls inside it (the root when n == 0).
  Node* insert(std::span<const int32_t> tokens, std::span<const int32_t> page_table);
  // Gives `slot` (a snapshot slot holding the state after node->end() tokens) to node. False, leaving the
  // slot with the caller, when the node already has one or is the root.
  bool set_snapshot(Node* node, int32_t slot);

  // Removes unlocked leaves, least valuable first, until `pages` pages went back to the pool or nothing is
  // left to evict. Returns the pages freed.
  int64_t evict_pages(int64_t pages);
  // Frees the least recently used snapshot (and its node, if that leaves an unlocked leaf without one).
  // False when the cache holds no snapshot.
  bool evict_snapshot();
  // Drops every snapshot and every unlocked node.
  void flush();

  int page_size() const { return page_size_; }
  int64_t node_count() const { return nodes_; }
  int64_t snapshot_count() const { return snapshots_; }
  const Node* root() const { return root_.get(); }

  // For tests and debugging: throws moeserve::Error naming the first broken structural invariant.
  void check_invariants() const;
  // Adds, per page, how many refs the tree holds (counts must have capacity() entries).
  void count_page_refs(std::vector<int32_t>& counts) const;

 private:
  Node* split(Node* node, int64_t upper_len);
  // Deletes a leaf: releases its pages and snapshot, unlinks it. Returns the pages that became free.
  int64_t remove_leaf(Node* leaf);
  int64_t first_page_index(int64_t pos) const { return pos / page_size_; }
  int64_t page_count(int64_t end) const { return (end + page_size_ - 1) / page_size_; }

  PagePool& pages_;
  SlotPool& slots_;
  int page_size_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  int64_t nodes_ = 0;
  int64_t snapshots_ = 0;
};

}  // namespace moeserve
