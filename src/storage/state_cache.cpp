#include "storage/state_cache.h"

#include <algorithm>
#include <bit>

#include "common/error.h"

namespace moeserve {

namespace {

// Bulk conversions for every GDN layer's state, twice per decode step. Fixed blocks of 16 so that -O2's
// vectoriser (straight-line code only) turns each block into a few SIMD instructions; the tail runs one by
// one. Rounding is f32_to_bf16's: nearest even, a NaN stays a quiet NaN.
constexpr int64_t kBlock = 16;

inline float widen_one(uint16_t v) {
  return std::bit_cast<float>(uint32_t(v) << 16);
}

inline uint16_t round_one(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

void widen(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) dst[i + j] = widen_one(src[i + j]);
  for (; i < n; ++i) dst[i] = widen_one(src[i]);
}

void round_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) dst[i + j] = round_one(src[i + j]);
  for (; i < n; ++i) dst[i] = round_one(src[i]);
}

}  // namespace

StateCache::StateCache(const StateCacheSpec& spec) : spec_(spec) {
  check(spec.dtype == DType::F32 || spec.dtype == DType::BF16, "GDN state: dtype {} (expected F32 or BF16)",
        dtype_name(spec.dtype));
  const size_t conv = size_t(spec.num_slots) * spec.num_layers * spec.conv_floats();
  const size_t rec = size_t(spec.num_slots) * spec.num_layers * spec.recurrent_floats();
  if (spec.dtype == DType::BF16 && spec.memory) {
    // Slots are cleared and copied as floats (two bf16 values each).
    check(spec.conv_floats() % 2 == 0 && spec.recurrent_floats() % 2 == 0,
          "GDN state: a bf16 pool in backend memory needs even state sizes (conv {}, recurrent {})",
          spec.conv_floats(), spec.recurrent_floats());
    conv16_ = spec.memory->allocate_cache_bf16(conv);
    rec16_ = conv16_ ? spec.memory->allocate_cache_bf16(rec) : nullptr;
    check(rec16_ != nullptr, "GDN state: this backend keeps float32 state only (no bf16 cache memory)");
  } else if (spec.dtype == DType::BF16) {
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
  if (spec_.memory) {
    if (conv_) spec_.memory->free_cache(conv_);
    if (rec_) spec_.memory->free_cache(rec_);
    if (conv16_) spec_.memory->free_cache(reinterpret_cast<float*>(conv16_));
    if (rec16_) spec_.memory->free_cache(reinterpret_cast<float*>(rec16_));
  }
}

void StateCache::load(int layer, int slot, float* conv, float* recurrent) const {
  check(!in_place(), "GDN state: load() is for a host bf16 pool; this pool is used in place");
  const uint16_t* c = conv16_ + offset(layer, slot, spec_.conv_floats());
  const uint16_t* r = rec16_ + offset(layer, slot, spec_.recurrent_floats());
  widen(c, conv, spec_.conv_floats());
  widen(r, recurrent, spec_.recurrent_floats());
}

void StateCache::store(int layer, int slot, const float* conv, const float* recurrent) {
  check(!in_place(), "GDN state: store() is for a host bf16 pool; this pool is used in place");
  round_bf16(conv, conv16_ + offset(layer, slot, spec_.conv_floats()), spec_.conv_floats());
  round_bf16(recurrent, rec16_ + offset(layer, slot, spec_.recurrent_floats()), spec_.recurrent_floats());
}

void StateCache::clear_slot(int slot) {
  const size_t conv_n = size_t(spec_.num_layers * spec_.conv_floats());
  const size_t rec_n = size_t(spec_.num_layers * spec_.recurrent_floats());
  if (spec_.memory) {  // a bf16 slot as floats: the sizes are even
    const size_t per = is_f32() ? 1 : 2;
    spec_.memory->zero_cache(conv(0, slot), conv_n / per);
    spec_.memory->zero_cache(recurrent(0, slot), rec_n / per);
  } else if (!is_f32()) {
    std::fill_n(conv16_ + offset(0, slot, spec_.conv_floats()), conv_n, uint16_t(0));
    std::fill_n(rec16_ + offset(0, slot, spec_.recurrent_floats()), rec_n, uint16_t(0));
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
    const size_t per = is_f32() ? 1 : 2;
    spec_.memory->copy_cache(conv(0, src), conv(0, dst), conv_n / per);
    spec_.memory->copy_cache(recurrent(0, src), recurrent(0, dst), rec_n / per);
  } else if (!is_f32()) {
    std::copy_n(conv16_ + offset(0, src, spec_.conv_floats()), conv_n,
                conv16_ + offset(0, dst, spec_.conv_floats()));
    std::copy_n(rec16_ + offset(0, src, spec_.recurrent_floats()), rec_n,
                rec16_ + offset(0, dst, spec_.recurrent_floats()));
  } else {
    std::copy_n(conv(0, src), conv_n, conv(0, dst));
    std::copy_n(recurrent(0, src), rec_n, recurrent(0, dst));
  }
}

}  // namespace moeserve
