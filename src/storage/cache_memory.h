#pragma once
// CacheMemory: where the KV pages and GDN state slots live. The default (no CacheMemory) is host memory; an
// accelerator backend hands out its own device memory so that its kernels read and write the caches in place.
// Every operation is ordered with that backend's work (a device backend runs them on its stream).

#include <cstddef>

namespace moeserve {

class CacheMemory {
 public:
  virtual ~CacheMemory() = default;
  // `floats` zero-initialised floats; freed with free_cache.
  virtual float* allocate_cache(size_t floats) = 0;
  virtual void free_cache(float* p) = 0;
  virtual void zero_cache(float* p, size_t floats) = 0;
  virtual void copy_cache(const float* src, float* dst, size_t floats) = 0;
};

}  // namespace moeserve
