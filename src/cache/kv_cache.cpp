#include "cache/kv_cache.h"

#include <algorithm>

namespace moeserve {

KvCache::KvCache(const KvCacheSpec& spec)
    : spec_(spec),
      k_(size_t(spec.num_layers) * spec.num_pages * spec.floats_per_page()),
      v_(k_.size()) {}

void KvCache::copy_page(int64_t src, int64_t dst, int rows) {
  int64_t n = int64_t(rows) * spec_.num_kv_heads * spec_.head_dim;
  for (int l = 0; l < spec_.num_layers; ++l) {
    std::copy_n(keys(l, src), n, keys(l, dst));
    std::copy_n(values(l, src), n, values(l, dst));
  }
}

}  // namespace moeserve
