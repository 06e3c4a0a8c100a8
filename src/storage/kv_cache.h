#pragma once
// KvCache: the storage of the paged attention KV cache (full-attention layers only). A page holds
// page_size consecutive positions of one sequence; a sequence's page table lists its pages in order, so
// position p of that sequence lives in page pages[p / page_size] at row p % page_size.
// This class owns memory only; which pages belong to whom is the engine's business (PagePool, RadixCache).
//
// Elements are stored as float32, bfloat16 (round to nearest even) or FP8 E4M3 (value / scale, rounded to
// nearest even and saturated to ±448, as vLLM and SGLang store an fp8 KV cache). Attention reads the stored
// type and widens in registers; only the writes round.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "storage/cache_memory.h"

namespace moeserve {

struct KvCacheSpec {
  int num_layers = 0;  // attention layers
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 16;
  int64_t num_pages = 0;
  CacheMemory* memory = nullptr;  // where the pages live (nullptr: host memory)
  DType dtype = DType::F32;       // F32, BF16 or F8_E4M3
  // FP8 only: per attention layer, the factor a stored code is multiplied by (the checkpoint's k_scale /
  // v_scale); empty means 1.0 for every layer.
  std::vector<float> k_scales = {}, v_scales = {};

  int64_t elements_per_row() const { return int64_t(num_kv_heads) * head_dim; }
  int64_t bytes_per_row() const { return elements_per_row() * int64_t(dtype_size(dtype)); }
  // One layer's K (or V) page, rounded up to 16 bytes so that every page starts aligned for vector loads.
  int64_t layer_page_bytes() const { return (int64_t(page_size) * bytes_per_row() + 15) / 16 * 16; }
  // What a page costs: K and V over every attention layer, in the stored dtype.
  int64_t bytes_per_page() const { return 2 * int64_t(num_layers) * layer_page_bytes(); }
  // K and V of one position over every attention layer, in the stored dtype.
  int64_t bytes_per_token() const { return 2 * int64_t(num_layers) * bytes_per_row(); }
};

// Whether `dtype` is one a KV cache stores.
bool is_kv_cache_dtype(DType dtype);
// --kv-cache-dtype: "auto" is nullopt; float32/fp32, bfloat16/bf16 and fp8/fp8_e4m3 (vLLM's and SGLang's
// spellings) name a dtype; anything else throws, naming the choices.
std::optional<DType> parse_kv_cache_dtype(std::string_view name);
// auto's choice: BF16 where the caches live in a backend's own memory (a GPU), float32 in host memory (the
// CPU backend, the reference).
DType resolve_kv_cache_dtype(std::optional<DType> asked, const CacheMemory* memory);
// "float32", "bfloat16" or "fp8_e4m3".
std::string_view kv_cache_dtype_name(DType dtype);

class KvCache {
 public:
  explicit KvCache(const KvCacheSpec& spec);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  const KvCacheSpec& spec() const { return spec_; }
  DType dtype() const { return spec_.dtype; }

  // Page `page` of attention layer `layer`: [page_size][num_kv_heads][head_dim] of dtype() (in spec().memory
  // when set).
  void* key_data(int layer, int64_t page) { return k_ + offset(layer, page); }
  void* value_data(int layer, int64_t page) { return v_ + offset(layer, page); }
  const void* key_data(int layer, int64_t page) const { return k_ + offset(layer, page); }
  const void* value_data(int layer, int64_t page) const { return v_ + offset(layer, page); }
  // The same pages of a float32 pool as floats (a pool of another dtype refuses).
  float* keys(int layer, int64_t page) { return as_f32(key_data(layer, page)); }
  float* values(int layer, int64_t page) { return as_f32(value_data(layer, page)); }
  const float* keys(int layer, int64_t page) const { return as_f32(key_data(layer, page)); }
  const float* values(int layer, int64_t page) const { return as_f32(value_data(layer, page)); }

  // What a stored FP8 code of `layer` is multiplied by (1.0 for other dtypes).
  float k_scale(int layer) const { return scale(spec_.k_scales, layer); }
  float v_scale(int layer) const { return scale(spec_.v_scales, layer); }

  // Host pools: stores `row` ([num_kv_heads][head_dim] floats) of K (resp. V) at `pos_in_page` of a page,
  // rounded to dtype().
  void write_key_row(int layer, int64_t page, int pos_in_page, const float* row);
  void write_value_row(int layer, int64_t page, int pos_in_page, const float* row);

  // Copies the first `rows` positions of page src into page dst in every layer (copy-on-write of a shared tail).
  void copy_page(int64_t src, int64_t dst, int rows);

 private:
  int64_t offset(int layer, int64_t page) const {
    return (int64_t(layer) * spec_.num_pages + page) * spec_.layer_page_bytes();
  }
  float scale(const std::vector<float>& scales, int layer) const {
    return spec_.dtype == DType::F8_E4M3 && !scales.empty() ? scales[size_t(layer)] : 1.0f;
  }
  float* as_f32(void* p) const;
  const float* as_f32(const void* p) const { return as_f32(const_cast<void*>(p)); }
  void write_row(std::byte* page_base, float scale, int pos_in_page, const float* row);

  KvCacheSpec spec_;
  std::vector<float> host_;  // K then V, when spec.memory is null
  std::byte* k_ = nullptr;
  std::byte* v_ = nullptr;
};

}  // namespace moeserve
