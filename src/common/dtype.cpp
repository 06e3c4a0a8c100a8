#include "common/dtype.h"

#include <array>
#include <cmath>

#include "common/error.h"

namespace moeserve {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 11> kDTypes = {{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F64, "F64", 8},
    {DType::I64, "I64", 8},
    {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
}};

// All 256 E4M3 values, computed once: decoding is then a table lookup.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
      int sign = v >> 7, exponent = (v >> 3) & 0xf, mantissa = v & 7;
      float magnitude;
      if (exponent == 0xf && mantissa == 7) {
        magnitude = NAN;
      } else if (exponent == 0) {
        magnitude = std::ldexp(float(mantissa) / 8.0f, -6);
      } else {
        magnitude = std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
      }
      t[v] = sign ? -magnitude : magnitude;
    }
    return t;
  }();
  return table;
}

}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& info : kDTypes)
    if (info.type == t) return info.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.type;
  return std::nullopt;
}

size_t dtype_size(DType t) {
  for (const auto& info : kDTypes)
    if (info.type == t) return info.size;
  return 0;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    float m = std::ldexp(float(mantissa), -24);
    return sign ? -m : m;
  }
  return std::bit_cast<float>(sign | uint32_t(exponent - 15 + 127) << 23 | (mantissa << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: quantise to multiples of 2^-24, ties to even
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t au = std::bit_cast<uint32_t>(a);
  au += 0xfffu + ((au >> 13) & 1u);
  return sign | uint16_t(((au >> 23) - 127 + 15) << 10 | ((au >> 13) & 0x3ff));
}

float fp8_e4m3_to_f32(uint8_t v) { return fp8_table()[v]; }

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fmin(std::fabs(f), 448.0f);
  // Search the 127 non-negative finite codes for the nearest; ties go to the even code.
  const auto& table = fp8_table();
  int best = 0;
  float best_error = a;
  for (int code = 1; code < 0x7f; ++code) {
    float error = std::fabs(table[code] - a);
    if (error < best_error || (error == best_error && (code & 1) == 0)) {
      best = code;
      best_error = error;
    }
  }
  return sign | uint8_t(best);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      const auto& table = fp8_table();
      for (size_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::F64: {
      auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    default:
      fail("cannot convert {} to float32", dtype_name(t));
  }
}

}  // namespace moeserve
