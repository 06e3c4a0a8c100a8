#include "cache/state_cache.h"

#include <algorithm>

#include "common/error.h"

namespace moeserve {

StateCache::StateCache(const StateCacheSpec& spec) : spec_(spec) {
  check(spec.dtype == DType::F32 || spec.dtype == DType::BF16, "GDN state: dtype {} (expected F32 or BF16)",
        dtype_name(spec.dtype));
  check(
      spec.dtype == DType::F32 || spec.memory == nullptr,
      "GDN state: a bf16 state pool lives in host memory (the CPU backend); this backend keeps float32 only");
  const size_t conv = size_t(spec.num_slots) * spec.num_layers * spec.conv_floats();
  const size_t rec = size_t(spec.num_slots) * spec.num_layers * spec.recurrent_floats();
  if (spec.dtype == DType::BF16) {
    host16_.resize(conv + rec);
    conv16_ = host16_.data();
    rec16_ = host16_.data() + conv;
  } else if (spec.memory) {
    conv_ = spec.memory->allocate_cache(conv);
    rec_ = spec.memory->allocate_cache(rec);
  } else {
    host_.resize(conv + rec);
    conv_ = host_.data();
    rec_ = host_.data() + conv;
  }
}

StateCache::~StateCache() {
  if (conv_ && spec_.memory) {
    spec_.memory->free_cache(conv_);
    spec_.memory->free_cache(rec_);
  }
}

void StateCache::load(int layer, int slot, float* conv, float* recurrent) const {
  check(!is_f32(), "GDN state: load() is for a bf16 pool; a float32 pool is used in place");
  const uint16_t* c = conv16_ + offset(layer, slot, spec_.conv_floats());
  const uint16_t* r = rec16_ + offset(layer, slot, spec_.recurrent_floats());
  std::transform(c, c + spec_.conv_floats(), conv, bf16_to_f32);
  std::transform(r, r + spec_.recurrent_floats(), recurrent, bf16_to_f32);
}

void StateCache::store(int layer, int slot, const float* conv, const float* recurrent) {
  check(!is_f32(), "GDN state: store() is for a bf16 pool; a float32 pool is used in place");
  std::transform(conv, conv + spec_.conv_floats(), conv16_ + offset(layer, slot, spec_.conv_floats()),
                 f32_to_bf16);
  std::transform(recurrent, recurrent + spec_.recurrent_floats(),
                 rec16_ + offset(layer, slot, spec_.recurrent_floats()), f32_to_bf16);
}

void StateCache::clear_slot(int slot) {
  const size_t conv_n = size_t(spec_.num_layers * spec_.conv_floats());
  const size_t rec_n = size_t(spec_.num_layers * spec_.recurrent_floats());
  if (!is_f32()) {
    std::fill_n(conv16_ + offset(0, slot, spec_.conv_floats()), conv_n, uint16_t(0));
    std::fill_n(rec16_ + offset(0, slot, spec_.recurrent_floats()), rec_n, uint16_t(0));
  } else if (spec_.memory) {
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
  if (!is_f32()) {
    std::copy_n(conv16_ + offset(0, src, spec_.conv_floats()), conv_n,
                conv16_ + offset(0, dst, spec_.conv_floats()));
    std::copy_n(rec16_ + offset(0, src, spec_.recurrent_floats()), rec_n,
                rec16_ + offset(0, dst, spec_.recurrent_floats()));
  } else if (spec_.memory) {
    spec_.memory->copy_cache(conv(0, src), conv(0, dst), conv_n);
    spec_.memory->copy_cache(recurrent(0, src), recurrent(0, dst), rec_n);
  } else {
    std::copy_n(conv(0, src), conv_n, conv(0, dst));
    std::copy_n(recurrent(0, src), rec_n, recurrent(0, dst));
  }
}

}  // namespace moeserve
