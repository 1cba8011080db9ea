// Small NEON helpers shared by the *_neon.cpp kernels (AArch64 only).
#pragma once

#include <arm_neon.h>

#include <cstdint>

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

// ---- Quant bytes of the int8 kernels (gemv_q8_neon.cpp, gemm_q8_dotprod.cpp) ----

// 32 bytes in element order: elements 0-15 in lo, 16-31 in hi.
struct Bytes32 {
  uint8x16_t lo, hi;
};

// The 32 nibbles of a 32-element block (Q4_0, Q4_1, Q5_*) in element
// order: the low nibbles of the 16 bytes are elements 0-15, the high ones
// 16-31.
static inline Bytes32 nibbles32(const uint8_t* qs) {
  const uint8x16_t v = vld1q_u8(qs);
  return {vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8(v, 4)};
}

// The 32 unsigned 5-bit quants of a Q5_0 / Q5_1 block in element order:
// the nibbles, plus 0x10 where bit i of the block's 32-bit qh is set.
static inline Bytes32 q5_quants32(const uint8_t* qs, const uint8_t* qh) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t sel = vld1q_u8(kBit), b4 = vdupq_n_u8(0x10);
  const Bytes32 q = nibbles32(qs);
  return {
      vorrq_u8(q.lo, vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), sel), b4)),
      vorrq_u8(q.hi, vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), sel), b4))};
}

// Sub-block j (0..7) of a Q4_K / Q5_K super-block as 32 unsigned quants
// (layout: see BlockQ4_K, BlockQ5_K; the fifth bit of element l is bit j of
// qh[l]); `qh` is null for Q4_K.
static inline Bytes32 q45_k_quants32(const uint8_t* qs, const uint8_t* qh, int j) {
  const uint8x16_t v0 = vld1q_u8(qs + 32 * (j / 2)), v1 = vld1q_u8(qs + 32 * (j / 2) + 16);
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  Bytes32 q = j % 2 == 0 ? Bytes32{vandq_u8(v0, m4), vandq_u8(v1, m4)}
                         : Bytes32{vshrq_n_u8(v0, 4), vshrq_n_u8(v1, 4)};
  if (qh != nullptr) {
    const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1u << j)), b4 = vdupq_n_u8(0x10);
    q.lo = vorrq_u8(q.lo, vandq_u8(vtstq_u8(vld1q_u8(qh), bit), b4));
    q.hi = vorrq_u8(q.hi, vandq_u8(vtstq_u8(vld1q_u8(qh + 16), bit), b4));
  }
  return q;
}

// Sub-block j (0..7) of a Q2_K / Q3_K super-block as 32 quants (layout: see
// BlockQ2_K): the 2-bit values for Q2_K (hmask null), the signed values
// q - 4 * !bit in [-4, 3] for Q3_K (as bytes: two's complement).
static inline Bytes32 q23_k_quants32(const uint8_t* qs, const uint8_t* hmask, int j) {
  const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * (j % 4)));
  const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1u << j)), four = vdupq_n_u8(4);
  uint8x16_t v[2];
  for (int h = 0; h < 2; ++h) {
    v[h] = vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * (j / 4) + 16 * h), shift), vdupq_n_u8(3));
    if (hmask != nullptr) {
      v[h] = vsubq_u8(v[h], vbicq_u8(four, vtstq_u8(vld1q_u8(hmask + 16 * h), bit)));
    }
  }
  return {v[0], v[1]};
}

// One half (128 elements) of a Q6_K super-block (ql: its 64 bytes, qh: its
// 32) as four runs of 32 unsigned 6-bit values (layout: see BlockQ6_K).
static inline void q6_k_runs32(const uint8_t* ql, const uint8_t* qh, Bytes32 runs[4]) {
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
  for (int j = 0; j < 2; ++j) {  // elements 16j .. 16j + 15 of each run
    const uint8x16_t la = vld1q_u8(ql + 16 * j), lb = vld1q_u8(ql + 32 + 16 * j);
    const uint8x16_t hb = vld1q_u8(qh + 16 * j);
    const uint8x16_t r[4] = {
        vorrq_u8(vandq_u8(la, m4), vshlq_n_u8(vandq_u8(hb, m2), 4)),
        vorrq_u8(vandq_u8(lb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m2), 4)),
        vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m2), 4)),
        vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4)),
    };
    for (int k = 0; k < 4; ++k) (j == 0 ? runs[k].lo : runs[k].hi) = r[k];
  }
}

}  // namespace cb::neon
