#pragma once
// EncoderCache: the vision tower's merged features of recently encoded images, so an image seen again (a
// later turn whose prefix-cache rows were evicted, the image not at the start of the prompt, the n choices
// of one request, two requests with one picture) skips the tower (docs/vision.md, "Encoder cache").
//
// Keyed by the image's content hash (of its decoded pixels, the one the prefix cache keys on) and its patch
// grid: the grid fixes the resize target, so the same picture at another min/max_pixels is another entry.
// Bounded in bytes of features; least recently used entries go first. Engine-thread only (not thread-safe).

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

namespace moeserve {

struct PromptImage;

class EncoderCache {
 public:
  using Features = std::shared_ptr<const std::vector<float>>;

  // max_bytes 0: nothing is kept.
  explicit EncoderCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The image's features (and it becomes the most recently used), or null.
  Features find(const PromptImage& image);
  // Keeps the image's features, evicting the least recently used entries until they fit; features larger
  // than the whole bound are not kept.
  void insert(const PromptImage& image, Features features);

  size_t bytes() const { return bytes_; }
  size_t entries() const { return index_.size(); }
  uint64_t evictions() const { return evictions_; }

  struct Key {
    std::array<uint64_t, 2> hash{};
    int64_t grid_t = 0, grid_h = 0, grid_w = 0;
    bool operator==(const Key&) const = default;
  };
  static Key key_of(const PromptImage& image);

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key;
    Features features;
  };
  size_t max_bytes_;
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
};

}  // namespace moeserve
