#include "storage/kv_cache.h"

#include <algorithm>

namespace moeserve {

KvCache::KvCache(const KvCacheSpec& spec) : spec_(spec) {
  const size_t n = size_t(spec.num_layers) * size_t(spec.num_pages) * size_t(spec.floats_per_page());
  if (spec.memory) {
    k_ = spec.memory->allocate_cache(n);
    v_ = spec.memory->allocate_cache(n);
  } else {
    host_.resize(2 * n);
    k_ = host_.data();
    v_ = host_.data() + n;
  }
}

KvCache::~KvCache() {
  if (spec_.memory) {
    spec_.memory->free_cache(k_);
    spec_.memory->free_cache(v_);
  }
}

void KvCache::copy_page(int64_t src, int64_t dst, int rows) {
  int64_t n = int64_t(rows) * spec_.num_kv_heads * spec_.head_dim;
  for (int l = 0; l < spec_.num_layers; ++l) {
    if (spec_.memory) {
      spec_.memory->copy_cache(keys(l, src), keys(l, dst), size_t(n));
      spec_.memory->copy_cache(values(l, src), values(l, dst), size_t(n));
    } else {
      std::copy_n(keys(l, src), n, keys(l, dst));
      std::copy_n(values(l, src), n, values(l, dst));
    }
  }
}

}  // namespace moeserve
