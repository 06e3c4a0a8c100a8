#include "storage/kv_cache.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace moeserve {

bool is_kv_cache_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F8_E4M3;
}

std::optional<DType> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return std::nullopt;
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::F8_E4M3;
  fail("KV cache dtype '{}' is not one of auto, float32 (fp32), bfloat16 (bf16), fp8_e4m3 (fp8)", name);
}

DType resolve_kv_cache_dtype(std::optional<DType> asked, const CacheMemory* memory) {
  return asked.value_or(memory ? DType::BF16 : DType::F32);
}

std::string_view kv_cache_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return "bfloat16";
    case DType::F8_E4M3:
      return "fp8_e4m3";
    default:
      return "float32";
  }
}

KvCache::KvCache(const KvCacheSpec& spec) : spec_(spec) {
  check(is_kv_cache_dtype(spec.dtype), "a KV cache stores float32, bfloat16 or fp8_e4m3, not {}",
        dtype_name(spec.dtype));
  for (const auto* scales : {&spec.k_scales, &spec.v_scales}) {
    check(scales->empty() || int(scales->size()) == spec.num_layers,
          "KV cache: {} scales for {} attention layers", scales->size(), spec.num_layers);
    for (float s : *scales)
      check(s > 0 && std::isfinite(s), "KV cache: scale {} is not a positive number", s);
  }
  // Whole floats: layer_page_bytes() is a multiple of 16.
  const size_t n = size_t(spec.num_layers) * size_t(spec.num_pages) * size_t(spec.layer_page_bytes() / 4);
  if (spec.memory) {
    k_ = reinterpret_cast<std::byte*>(spec.memory->allocate_cache(n));
    v_ = reinterpret_cast<std::byte*>(spec.memory->allocate_cache(n));
  } else {
    host_.resize(2 * n);
    k_ = reinterpret_cast<std::byte*>(host_.data());
    v_ = reinterpret_cast<std::byte*>(host_.data() + n);
  }
}

KvCache::~KvCache() {
  if (spec_.memory) {
    spec_.memory->free_cache(reinterpret_cast<float*>(k_));
    spec_.memory->free_cache(reinterpret_cast<float*>(v_));
  }
}

float* KvCache::as_f32(void* p) const {
  check(spec_.dtype == DType::F32, "the KV cache stores {}, not float32", dtype_name(spec_.dtype));
  return static_cast<float*>(p);
}

void KvCache::write_key_row(int layer, int64_t page, int pos_in_page, const float* row) {
  write_row(static_cast<std::byte*>(key_data(layer, page)), k_scale(layer), pos_in_page, row);
}

void KvCache::write_value_row(int layer, int64_t page, int pos_in_page, const float* row) {
  write_row(static_cast<std::byte*>(value_data(layer, page)), v_scale(layer), pos_in_page, row);
}

void KvCache::write_row(std::byte* page_base, float scale, int pos_in_page, const float* row) {
  const int64_t n = spec_.elements_per_row();
  std::byte* dst = page_base + pos_in_page * spec_.bytes_per_row();
  switch (spec_.dtype) {
    case DType::BF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(row[i]);
      break;
    }
    case DType::F8_E4M3: {
      auto* d = reinterpret_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8_e4m3(row[i] / scale);
      break;
    }
    default:
      std::memcpy(dst, row, size_t(n) * sizeof(float));
      break;
  }
}

void KvCache::copy_page(int64_t src, int64_t dst, int rows) {
  // Whole floats, within the page: layer_page_bytes() is a multiple of 16.
  const size_t floats = size_t((int64_t(rows) * spec_.bytes_per_row() + 3) / 4);
  for (int l = 0; l < spec_.num_layers; ++l) {
    for (auto [s, d] :
         {std::pair{key_data(l, src), key_data(l, dst)}, std::pair{value_data(l, src), value_data(l, dst)}}) {
      if (spec_.memory)
        spec_.memory->copy_cache(static_cast<const float*>(s), static_cast<float*>(d), floats);
      else
        std::memcpy(d, s, floats * sizeof(float));
    }
  }
}

}  // namespace moeserve
