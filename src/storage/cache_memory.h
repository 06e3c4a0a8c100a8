#pragma once
// CacheMemory: where the KV pages and GDN state slots live. The default (no CacheMemory) is host memory; an
// accelerator backend hands out its own device memory so that its kernels read and write the caches in place.
// Every operation is ordered with that backend's work (a device backend runs them on its stream).

#include <cstddef>
#include <cstdint>

namespace moeserve {

class CacheMemory {
 public:
  virtual ~CacheMemory() = default;
  // `floats` zero-initialised floats; freed with free_cache.
  virtual float* allocate_cache(size_t floats) = 0;
  // `values` zero-initialised bf16 values for GDN state slots that this backend's kernels read and write in
  // place as bf16, freed with free_cache; nullptr where the backend keeps float32 state only. zero_cache and
  // copy_cache count such a range in floats (two values each).
  virtual uint16_t* allocate_cache_bf16(size_t values) {
    (void)values;
    return nullptr;
  }
  virtual void free_cache(float* p) = 0;
  virtual void zero_cache(float* p, size_t floats) = 0;
  virtual void copy_cache(const float* src, float* dst, size_t floats) = 0;
};

}  // namespace moeserve
