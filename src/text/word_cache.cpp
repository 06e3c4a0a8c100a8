#include "text/word_cache.h"

#include <algorithm>

namespace moeserve::text {

WordCache::WordCache() : slots_(kSlots, Slot{0, 0, 0, 0, 0}) {}

bool WordCache::append_cached(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = slots_[i];
    if (slot.hash == 0) return false;
    if (slot.hash == hash && slot.key_size == word.size() &&
        std::memcmp(keys_.data() + slot.key_offset, word.data(), word.size()) == 0) {
      const int32_t* ids = ids_.data() + slot.ids_offset;
      out.insert(out.end(), ids, ids + slot.ids_size);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids) {
  if (word.size() > kMaxWordBytes) return;
  if (entries_ >= kMaxEntries || keys_.size() + word.size() > kMaxKeyBytes ||
      ids_.size() + ids.size() > kMaxIds)
    clear();
  size_t i = hash & (kSlots - 1);
  while (slots_[i].hash != 0) i = (i + 1) & (kSlots - 1);
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint16_t>(word.size()), static_cast<uint16_t>(ids.size())};
  keys_.append(word);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++entries_;
}

void WordCache::clear() {
  if (entries_ == 0) return;
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, 0, 0, 0});
  keys_.clear();
  ids_.clear();
  entries_ = 0;
}

}  // namespace moeserve::text
