#pragma once
// PagePool: which KV pages are free, and how many holders each used page has. A holder is a running
// sequence's page table or a radix-cache node; a page returns to the free list when its last holder lets go,
// so sharing a prefix between the cache and several requests needs no ownership rules beyond ref/unref.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moeserve {

class PagePool {
 public:
  explicit PagePool(int64_t num_pages);

  int64_t capacity() const { return int64_t(refs_.size()); }
  int64_t free_pages() const { return int64_t(free_.size()); }
  int64_t used_pages() const { return capacity() - free_pages(); }

  // A free page with one holder, or -1 when none is free (the caller evicts and retries, or waits).
  int32_t allocate();
  void ref(int32_t page);  // one more holder of a page in use
  // One holder fewer; true when that was the last and the page is free again.
  bool unref(int32_t page);
  int refcount(int32_t page) const { return refs_[size_t(page)]; }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first (warm in cache)
};

}  // namespace moeserve
