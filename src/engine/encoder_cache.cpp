#include "engine/encoder_cache.h"

#include "engine/engine.h"

namespace moeserve {

namespace {

size_t bytes_of(const EncoderCache::Features& f) {
  return f ? f->size() * sizeof(float) : 0;
}

}  // namespace

EncoderCache::Key EncoderCache::key_of(const PromptImage& image) {
  return {image.hash, image.patches.grid_t, image.patches.grid_h, image.patches.grid_w};
}

size_t EncoderCache::KeyHash::operator()(const Key& k) const {
  // The content hash is already uniform; the grid only tells apart one picture at several sizes.
  return size_t(k.hash[0] ^ (k.hash[1] * 0x9e3779b97f4a7c15ull) ^ uint64_t(k.grid_h << 20) ^
                uint64_t(k.grid_w));
}

EncoderCache::Features EncoderCache::find(const PromptImage& image) {
  auto it = index_.find(key_of(image));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->features;
}

void EncoderCache::insert(const PromptImage& image, Features features) {
  const size_t size = bytes_of(features);
  if (size == 0 || size > max_bytes_) return;
  const Key key = key_of(image);
  if (auto it = index_.find(key); it != index_.end()) {  // already kept (the same features): refresh it
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  while (bytes_ + size > max_bytes_) {
    bytes_ -= bytes_of(lru_.back().features);
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++evictions_;
  }
  lru_.push_front({key, std::move(features)});
  index_.emplace(key, lru_.begin());
  bytes_ += size;
}

}  // namespace moeserve
