#include "cache/slot_pool.h"

#include <cassert>

#include "common/error.h"

namespace moeserve {

SlotPool::SlotPool(int live, int snapshots)
    : live_(live), snapshots_(snapshots), in_use_(size_t(live) + size_t(snapshots), false) {
  check(live >= 0 && snapshots >= 0, "slot pool: negative slot count ({} live, {} snapshots)", live,
        snapshots);
  for (int s = live - 1; s >= 0; --s) free_live_.push_back(s);
  for (int s = live + snapshots - 1; s >= live; --s) free_snapshot_.push_back(s);
}

static int32_t take(std::vector<int32_t>& free, std::vector<bool>& in_use) {
  if (free.empty()) return -1;
  int32_t slot = free.back();
  free.pop_back();
  in_use[size_t(slot)] = true;
  return slot;
}

int32_t SlotPool::allocate_live() {
  return take(free_live_, in_use_);
}
int32_t SlotPool::allocate_snapshot() {
  return take(free_snapshot_, in_use_);
}

void SlotPool::free_live(int32_t slot) {
  assert(is_live(slot) && in_use_[size_t(slot)] && "free of a live slot not in use");
  in_use_[size_t(slot)] = false;
  free_live_.push_back(slot);
}

void SlotPool::free_snapshot(int32_t slot) {
  assert(is_snapshot(slot) && in_use_[size_t(slot)] && "free of a snapshot slot not in use");
  in_use_[size_t(slot)] = false;
  free_snapshot_.push_back(slot);
}

}  // namespace moeserve
