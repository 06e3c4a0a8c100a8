// KvCache in each stored dtype: the bytes a row becomes, what a page costs, copy-on-write of a partial page,
// FP8 scales, and the --kv-cache-dtype spellings.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "storage/kv_cache.h"

namespace moeserve {
namespace {

KvCacheSpec spec(DType dtype, int64_t pages = 4) {
  KvCacheSpec s;
  s.num_layers = 2, s.num_kv_heads = 2, s.head_dim = 8, s.page_size = 4, s.num_pages = pages, s.dtype = dtype;
  return s;
}

std::vector<float> random_row(std::mt19937& rng, size_t n, float range) {
  std::vector<float> r(n);
  for (auto& x : r) x = std::uniform_real_distribution<float>(-range, range)(rng);
  return r;
}

TEST(KvCache, BytesPerTokenAreTheStoredDtypes) {
  // The 35B-A3B shape: 10 attention layers x K,V x 2 KV heads x 256.
  KvCacheSpec s;
  s.num_layers = 10, s.num_kv_heads = 2, s.head_dim = 256, s.page_size = 16;
  for (auto [dtype, bytes] : {std::pair{DType::F32, 40960}, {DType::BF16, 20480}, {DType::F8_E4M3, 10240}}) {
    s.dtype = dtype;
    EXPECT_EQ(s.bytes_per_token(), bytes) << dtype_name(dtype);
    EXPECT_EQ(s.bytes_per_page(), 16 * bytes);  // whole 16-byte rows: no padding
  }
  // A page of odd rows is padded to 16 bytes so the next one starts aligned.
  KvCacheSpec odd = spec(DType::F8_E4M3);
  odd.head_dim = 2, odd.num_kv_heads = 1, odd.page_size = 3;  // 6 bytes of codes
  EXPECT_EQ(odd.layer_page_bytes(), 16);
}

TEST(KvCache, RowsAreStoredRoundedToTheDtype) {
  std::mt19937 rng(1);
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvCacheSpec s = spec(dtype);
    if (dtype == DType::F8_E4M3) s.k_scales = {0.25f, 1.0f}, s.v_scales = {4.0f, 1.0f};
    KvCache kv(s);
    const size_t n = size_t(s.elements_per_row());
    // Values beyond FP8's ±448 x scale saturate rather than turn into NaN.
    auto k = random_row(rng, n, 600.0f), v = random_row(rng, n, 600.0f);
    kv.write_key_row(0, 3, 2, k.data());
    kv.write_value_row(0, 3, 2, v.data());
    const auto* kb = static_cast<const uint8_t*>(kv.key_data(0, 3)) + 2 * s.bytes_per_row();
    const auto* vb = static_cast<const uint8_t*>(kv.value_data(0, 3)) + 2 * s.bytes_per_row();
    for (size_t i = 0; i < n; ++i) {
      if (dtype == DType::F32) {
        EXPECT_EQ(reinterpret_cast<const float*>(kb)[i], k[i]);
      } else if (dtype == DType::BF16) {
        EXPECT_EQ(reinterpret_cast<const uint16_t*>(kb)[i], f32_to_bf16(k[i]));
        EXPECT_EQ(reinterpret_cast<const uint16_t*>(vb)[i], f32_to_bf16(v[i]));
      } else {
        EXPECT_EQ(kb[i], f32_to_fp8_e4m3(k[i] / 0.25f));
        EXPECT_EQ(vb[i], f32_to_fp8_e4m3(v[i] / 4.0f));
        EXPECT_LE(std::abs(fp8_e4m3_to_f32(kb[i]) * kv.k_scale(0)), 448.0f * 0.25f);
      }
    }
    EXPECT_EQ(kv.k_scale(0), dtype == DType::F8_E4M3 ? 0.25f : 1.0f);
    EXPECT_EQ(kv.v_scale(1), 1.0f);
  }
}

TEST(KvCache, CopyPageCopiesThePartialTailOfEveryLayer) {
  std::mt19937 rng(2);
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvCacheSpec s = spec(dtype);
    KvCache kv(s);
    const size_t n = size_t(s.elements_per_row());
    for (int l = 0; l < 2; ++l)
      for (int r = 0; r < 4; ++r) {
        auto row = random_row(rng, n, 2.0f);
        kv.write_key_row(l, 1, r, row.data());
        kv.write_value_row(l, 1, r, row.data());
      }
    kv.copy_page(1, 2, 3);
    const size_t rows3 = size_t(3 * s.bytes_per_row());
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(std::memcmp(kv.key_data(l, 1), kv.key_data(l, 2), rows3), 0);
      EXPECT_EQ(std::memcmp(kv.value_data(l, 1), kv.value_data(l, 2), rows3), 0);
      // The fourth row is not copied (the copy's owner writes it next).
      const auto* last = static_cast<const uint8_t*>(kv.key_data(l, 2)) + rows3;
      EXPECT_EQ(std::count(last, last + s.bytes_per_row(), 0), s.bytes_per_row());
    }
  }
}

TEST(KvCache, RefusesOtherDtypesBadScalesAndFloatViewsOfNarrowPools) {
  EXPECT_THROW(KvCache{spec(DType::F16)}, Error);
  KvCacheSpec s = spec(DType::F8_E4M3);
  s.k_scales = {1.0f};  // one scale for two layers
  EXPECT_THROW(KvCache{s}, Error);
  s.k_scales = {1.0f, 0.0f};
  EXPECT_THROW(KvCache{s}, Error);
  KvCache bf16(spec(DType::BF16));
  EXPECT_THROW(bf16.keys(0, 0), Error);
  KvCache f32(spec(DType::F32));
  EXPECT_EQ(static_cast<void*>(f32.keys(1, 2)), f32.key_data(1, 2));
}

TEST(KvCache, DtypeFlagSpellingsOfVllmAndSglang) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_cache_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_kv_cache_dtype("fp32"), DType::F32);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), DType::F8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), DType::F8_E4M3);
  EXPECT_THROW(parse_kv_cache_dtype("fp8_e5m2"), Error);
  EXPECT_EQ(kv_cache_dtype_name(*parse_kv_cache_dtype("bf16")), "bfloat16");
  // auto: bf16 where a backend keeps the caches in its own memory, float32 in host memory.
  struct Device : CacheMemory {
    float* allocate_cache(size_t) override { return nullptr; }
    void free_cache(float*) override {}
    void zero_cache(float*, size_t) override {}
    void copy_cache(const float*, float*, size_t) override {}
  } device;
  EXPECT_EQ(resolve_kv_cache_dtype(std::nullopt, nullptr), DType::F32);
  EXPECT_EQ(resolve_kv_cache_dtype(std::nullopt, &device), DType::BF16);
  EXPECT_EQ(resolve_kv_cache_dtype(DType::F8_E4M3, nullptr), DType::F8_E4M3);
}

}  // namespace
}  // namespace moeserve
