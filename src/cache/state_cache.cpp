#include "cache/state_cache.h"

#include <algorithm>

namespace moeserve {

StateCache::StateCache(const StateCacheSpec& spec)
    : spec_(spec),
      conv_(size_t(spec.num_slots) * spec.num_layers * spec.conv_floats()),
      rec_(size_t(spec.num_slots) * spec.num_layers * spec.recurrent_floats()) {}

void StateCache::clear_slot(int slot) {
  std::fill_n(conv(0, slot), spec_.num_layers * spec_.conv_floats(), 0.0f);
  std::fill_n(recurrent(0, slot), spec_.num_layers * spec_.recurrent_floats(), 0.0f);
}

void StateCache::copy_slot(int src, int dst) {
  if (src == dst) return;
  std::copy_n(conv(0, src), spec_.num_layers * spec_.conv_floats(), conv(0, dst));
  std::copy_n(recurrent(0, src), spec_.num_layers * spec_.recurrent_floats(), recurrent(0, dst));
}

}  // namespace moeserve
