#include "cache/state_cache.h"

#include <algorithm>

namespace moeserve {

StateCache::StateCache(const StateCacheSpec& spec) : spec_(spec) {
  const size_t conv = size_t(spec.num_slots) * spec.num_layers * spec.conv_floats();
  const size_t rec = size_t(spec.num_slots) * spec.num_layers * spec.recurrent_floats();
  if (spec.memory) {
    conv_ = spec.memory->allocate_cache(conv);
    rec_ = spec.memory->allocate_cache(rec);
  } else {
    host_.resize(conv + rec);
    conv_ = host_.data();
    rec_ = host_.data() + conv;
  }
}

StateCache::~StateCache() {
  if (spec_.memory) {
    spec_.memory->free_cache(conv_);
    spec_.memory->free_cache(rec_);
  }
}

void StateCache::clear_slot(int slot) {
  const size_t conv_n = size_t(spec_.num_layers * spec_.conv_floats());
  const size_t rec_n = size_t(spec_.num_layers * spec_.recurrent_floats());
  if (spec_.memory) {
    spec_.memory->zero_cache(conv(0, slot), conv_n);
    spec_.memory->zero_cache(recurrent(0, slot), rec_n);
  } else {
    std::fill_n(conv(0, slot), conv_n, 0.0f);
    std::fill_n(recurrent(0, slot), rec_n, 0.0f);
  }
}

void StateCache::copy_slot(int src, int dst) {
  if (src == dst) return;
  const size_t conv_n = size_t(spec_.num_layers * spec_.conv_floats());
  const size_t rec_n = size_t(spec_.num_layers * spec_.recurrent_floats());
  if (spec_.memory) {
    spec_.memory->copy_cache(conv(0, src), conv(0, dst), conv_n);
    spec_.memory->copy_cache(recurrent(0, src), recurrent(0, dst), rec_n);
  } else {
    std::copy_n(conv(0, src), conv_n, conv(0, dst));
    std::copy_n(recurrent(0, src), rec_n, recurrent(0, dst));
  }
}

}  // namespace moeserve
