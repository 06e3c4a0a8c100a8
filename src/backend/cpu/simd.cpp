// Compiled once per SIMD target by Highway's foreach_target; see simd.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "backend/cpu/simd.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float DotImpl(const float* a, const float* b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Dot4Impl(const float* x, const float* r0, const float* r1, const float* r2, const float* r3, size_t n,
              float* out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto xv = hn::LoadU(d, x + i);
    s0 = hn::MulAdd(xv, hn::LoadU(d, r0 + i), s0);
    s1 = hn::MulAdd(xv, hn::LoadU(d, r1 + i), s1);
    s2 = hn::MulAdd(xv, hn::LoadU(d, r2 + i), s2);
    s3 = hn::MulAdd(xv, hn::LoadU(d, r3 + i), s3);
  }
  out[0] = hn::GetLane(hn::SumOfLanes(d, s0));
  out[1] = hn::GetLane(hn::SumOfLanes(d, s1));
  out[2] = hn::GetLane(hn::SumOfLanes(d, s2));
  out[3] = hn::GetLane(hn::SumOfLanes(d, s3));
  for (; i < n; ++i) {
    out[0] += x[i] * r0[i];
    out[1] += x[i] * r1[i];
    out[2] += x[i] * r2[i];
    out[3] += x[i] * r3[i];
  }
}

void AxpyImpl(float a, const float* x, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto av = hn::Set(d, a);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::MulAdd(av, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

void Bf16ToF32Impl(const uint16_t* src, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    // bf16 is the top half of a float32: widen and shift into place.
    const auto wide = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)));
    hn::StoreU(hn::BitCast(df, wide), df, dst + i);
  }
  for (; i < n; ++i) {
    uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

void Fp8ToF32Impl(const uint8_t* src, float scale, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t N = hn::Lanes(df);
  // Normal codes: move exponent and mantissa into float32 position and rebias 7 -> 127 by multiplying with
  // 2^120; subnormal codes (exponent 0) come out right by the same multiplication, since float32 keeps
  // them normal. Only the sign needs its own shift.
  const auto rebias = hn::Set(df, 0x1p120f * scale);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::PromoteTo(du32, hn::LoadU(du8, src + i));
    const auto magnitude = hn::ShiftLeft<20>(hn::And(v, hn::Set(du32, 0x7f)));
    const auto sign = hn::ShiftLeft<24>(hn::And(v, hn::Set(du32, 0x80)));
    hn::StoreU(hn::Mul(hn::BitCast(df, hn::Or(magnitude, sign)), rebias), df, dst + i);
  }
  for (; i < n; ++i) {
    uint32_t bits = (uint32_t(src[i] & 0x7f) << 20) | (uint32_t(src[i] & 0x80) << 24);
    float f;
    std::memcpy(&f, &bits, 4);
    dst[i] = f * 0x1p120f * scale;
  }
}

}  // namespace moeserve::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moeserve::cpu {
HWY_EXPORT(DotImpl);
HWY_EXPORT(Dot4Impl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(Bf16ToF32Impl);
HWY_EXPORT(Fp8ToF32Impl);

float dot(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n); }
void dot4(const float* x, const float* r0, const float* r1, const float* r2, const float* r3, size_t n,
          float* out) {
  HWY_DYNAMIC_DISPATCH(Dot4Impl)(x, r0, r1, r2, r3, n, out);
}
void axpy(float a, const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(AxpyImpl)(a, x, y, n); }
void bf16_to_f32(const uint16_t* src, float* dst, size_t n) { HWY_DYNAMIC_DISPATCH(Bf16ToF32Impl)(src, dst, n); }
void fp8_e4m3_to_f32(const uint8_t* src, float scale, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(Fp8ToF32Impl)(src, scale, dst, n);
}
}  // namespace moeserve::cpu
#endif
