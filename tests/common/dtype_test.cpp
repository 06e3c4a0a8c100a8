#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moeserve {
namespace {

TEST(DType, Bf16RoundTripsExactValuesAndRoundsToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, 1.5f, 65536.0f}) EXPECT_EQ(bf16_to_f32(f32_to_bf16(v)), v);
  // 1 + 2^-8 sits exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even mantissa (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesIeeeHalf) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  for (float v : {0.5f, -1.25f, 1000.0f, std::ldexp(1.0f, -20)}) EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v);
}

TEST(DType, Fp8E4M3DecodesTheOcpTable) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);                  // exponent 7 = bias
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

TEST(DType, Fp8EncodeIsNearestAndSaturates) {
  for (int code = 0; code < 0x7f; ++code) {
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(code))), code);
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(1.06f)), 1.0f);  // 1.0625 is the tie between 1 and 1.125
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(1.07f)), 1.125f);
}

TEST(DType, ParsesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(parse_dtype("bf16"), std::nullopt);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_EQ(dtype_name(DType::F16), "F16");
}

}  // namespace
}  // namespace moeserve
