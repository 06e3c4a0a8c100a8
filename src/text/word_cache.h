#pragma once
// A bounded cache from a pre-token's bytes to its BPE ids: the tokenizer's hot path, since most text repeats
// a small set of pre-tokens. Internal to the tokenizer; one per thread, so it takes no locks.
//
// Open addressing over a flat slot array; keys and ids live in two arenas, so a hit costs one hash, one probe
// (usually) and one memcmp, and an insert allocates nothing once the arenas have grown. When full it is
// emptied at once instead of evicting: the ids of text that repeats come back within a few words.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::text {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;  // longer pre-tokens are rare: not worth a slot
  static constexpr size_t kMaxEntries = 1 << 16;

  WordCache();

  // Appends the ids cached for word (whose hash() is given) to out; false when word is not cached.
  bool append_cached(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  // Words longer than kMaxWordBytes are not cached.
  void insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids);
  void clear();

  // Tags the cache with the tokenizer that fills it; switching tokenizers empties it.
  void set_owner(uint64_t owner) {
    if (owner != owner_) {
      clear();
      owner_ = owner;
    }
  }

  static uint64_t hash(std::string_view s) {
    // Eight bytes per multiply; the final mix spreads the high bits into the slot index (low bits).
    uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t chunk;
      std::memcpy(&chunk, s.data() + i, 8);
      h = (h ^ chunk) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
    }
    if (i < s.size()) {
      uint64_t chunk = 0;
      std::memcpy(&chunk, s.data() + i, s.size() - i);
      h = (h ^ chunk) * 0xBF58476D1CE4E5B9ull;
    }
    h ^= h >> 32;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    return h | 1;  // 0 marks an empty slot
  }

 private:
  struct Slot {
    uint64_t hash;  // 0: empty
    uint32_t key_offset;
    uint32_t ids_offset;
    uint16_t key_size;
    uint16_t ids_size;
  };
  static constexpr size_t kSlots = kMaxEntries * 2;  // load factor at most 1/2: short probe runs
  static constexpr size_t kMaxKeyBytes = 4 << 20;    // arena bounds: empty the cache past them
  static constexpr size_t kMaxIds = 1 << 20;

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
  uint64_t owner_ = 0;
};

}  // namespace moeserve::text
