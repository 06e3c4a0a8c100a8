#pragma once
// KvCache: the storage of the paged attention KV cache (full-attention layers only). A page holds
// page_size consecutive positions of one sequence; a sequence's page table lists its pages in order, so
// position p of that sequence lives in page pages[p / page_size] at row p % page_size.
// This class owns memory only; which pages belong to whom is the engine's business (PagePool, RadixCache).

#include <cstdint>
#include <vector>

#include "storage/cache_memory.h"

namespace moeserve {

struct KvCacheSpec {
  int num_layers = 0;  // attention layers
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 16;
  int64_t num_pages = 0;
  CacheMemory* memory = nullptr;  // where the pages live (nullptr: host memory)

  int64_t floats_per_page() const { return int64_t(page_size) * num_kv_heads * head_dim; }
  // K and V over every attention layer, float32.
  int64_t bytes_per_token() const { return int64_t(2) * num_layers * num_kv_heads * head_dim * 4; }
};

class KvCache {
 public:
  explicit KvCache(const KvCacheSpec& spec);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  const KvCacheSpec& spec() const { return spec_; }

  // Page `page` of attention layer `layer`: [page_size][num_kv_heads][head_dim] (in spec().memory when set).
  float* keys(int layer, int64_t page) { return k_ + offset(layer, page); }
  float* values(int layer, int64_t page) { return v_ + offset(layer, page); }
  const float* keys(int layer, int64_t page) const { return k_ + offset(layer, page); }
  const float* values(int layer, int64_t page) const { return v_ + offset(layer, page); }

  // Copies the first `rows` positions of page src into page dst in every layer (copy-on-write of a shared tail).
  void copy_page(int64_t src, int64_t dst, int rows);

 private:
  int64_t offset(int layer, int64_t page) const {
    return (int64_t(layer) * spec_.num_pages + page) * spec_.floats_per_page();
  }
  KvCacheSpec spec_;
  std::vector<float> host_;  // K then V, when spec.memory is null
  float* k_ = nullptr;
  float* v_ = nullptr;
};

}  // namespace moeserve
