// Small NEON helpers shared by the *_neon.cpp kernels (AArch64 only).
#pragma once

#include <arm_neon.h>

namespace cb::neon {

// e^x for each lane, relative error about 1e-7: the same range reduction
// and degree-7 polynomial as avx2::exp256.  Inputs are clamped to
// [-87.3, 88], so the result is always a finite normal number.
static inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.0f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

// Four consecutive elements as floats: f32, or f16 bits widened (exact).
static inline float32x4_t load4(const float* p) {
  return vld1q_f32(p);
}
static inline float32x4_t load4(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline float to_f32(float x) {
  return x;
}
static inline float to_f32(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// Transposes the 4 x 4 block src[i * lds + j] into dst[j * ldd + i].
template <class T>
static inline void transpose4(const T* src, int64_t lds, float* dst, int64_t ldd) {
  const float32x4x2_t t01 = vtrnq_f32(load4(src), load4(src + lds));
  const float32x4x2_t t23 = vtrnq_f32(load4(src + 2 * lds), load4(src + 3 * lds));
  vst1q_f32(dst, vcombine_f32(vget_low_f32(t01.val[0]), vget_low_f32(t23.val[0])));
  vst1q_f32(dst + ldd, vcombine_f32(vget_low_f32(t01.val[1]), vget_low_f32(t23.val[1])));
  vst1q_f32(dst + 2 * ldd, vcombine_f32(vget_high_f32(t01.val[0]), vget_high_f32(t23.val[0])));
  vst1q_f32(dst + 3 * ldd, vcombine_f32(vget_high_f32(t01.val[1]), vget_high_f32(t23.val[1])));
}

}  // namespace cb::neon
