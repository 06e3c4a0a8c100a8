#pragma once
// Element types of checkpoint tensors and the scalar conversions to float32.
// Compute is float32 everywhere on the CPU; weights stay in their stored type and are widened on use.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F64, I64, I32, I16, I8, U8, BOOL };

// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...). parse_dtype returns nullopt for unknown names.
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);
size_t dtype_size(DType t);

inline float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// OCP FP8 E4M3 "fn" (torch.float8_e4m3fn): bias 7, no infinities, 0x7f/0xff are NaN, max 448.
float fp8_e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to ±448 (what torch's .to(float8_e4m3fn) does after clamping).
uint8_t f32_to_fp8_e4m3(float f);

// Widens n elements of a float-like type (F32, F16, BF16, F8_E4M3, F64) to float32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace moeserve
