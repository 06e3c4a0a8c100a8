#include "cache/page_pool.h"

#include <cassert>

#include "common/error.h"

namespace moeserve {

PagePool::PagePool(int64_t num_pages) : refs_(size_t(num_pages), 0) {
  check(num_pages >= 0 && num_pages <= INT32_MAX, "page pool: {} pages is out of range", num_pages);
  free_.reserve(size_t(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

int32_t PagePool::allocate() {
  if (free_.empty()) return -1;
  int32_t page = free_.back();
  free_.pop_back();
  refs_[size_t(page)] = 1;
  return page;
}

void PagePool::ref(int32_t page) {
  assert(refs_[size_t(page)] > 0 && "ref of a free page");
  ++refs_[size_t(page)];
}

bool PagePool::unref(int32_t page) {
  assert(refs_[size_t(page)] > 0 && "unref of a free page");
  if (--refs_[size_t(page)] > 0) return false;
  free_.push_back(page);
  return true;
}

}  // namespace moeserve
