#pragma once
// SlotPool: the GDN state slots of one StateCache, split by an explicit budget into live slots (one per
// running sequence, advanced in place by every forward step) and snapshot slots (frozen copies held by
// radix-cache nodes). Slots [0, live) are live, [live, live + snapshots) are snapshots; neither kind borrows
// from the other, so a burst of cached snapshots can never block admission and vice versa.

#include <cstdint>
#include <vector>

namespace moeserve {

class SlotPool {
 public:
  SlotPool(int live, int snapshots);

  int live_total() const { return live_; }
  int snapshot_total() const { return snapshots_; }
  int live_free() const { return int(free_live_.size()); }
  int snapshot_free() const { return int(free_snapshot_.size()); }
  int live_used() const { return live_ - live_free(); }
  int snapshot_used() const { return snapshots_ - snapshot_free(); }

  int32_t allocate_live();  // -1 when none is free
  void free_live(int32_t slot);
  int32_t allocate_snapshot();  // -1 when none is free
  void free_snapshot(int32_t slot);

  bool is_live(int32_t slot) const { return slot >= 0 && slot < live_; }
  bool is_snapshot(int32_t slot) const { return slot >= live_ && slot < live_ + snapshots_; }

 private:
  int live_, snapshots_;
  std::vector<int32_t> free_live_, free_snapshot_;
  std::vector<bool> in_use_;
};

}  // namespace moeserve
