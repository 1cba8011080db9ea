// The NEON int8 GEMV of decode with the baseline widening multiplies, so
// it runs on every AArch64 core (gemv_q8_neon.h; the AVX2 version is
// gemv_q8_avx2.cpp), and the activations' int8 quantization.
#include <arm_neon.h>

#include <cstdint>

#include "kernels/cpu/gemv_q8_neon.h"
#include "kernels/cpu/ops_neon.h"

namespace cb::neon {
namespace {

// acc + pairwise sums of w[i] * x[i] over 16 bytes: SMULL/SMLAL2 into 8
// int16 lanes (each the sum of two products), SADALP into int32.
struct WideningDot {
  static int32x4_t dot16(int8x16_t w, int8x16_t x, int32x4_t acc) {
    int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    p = vmlal_high_s8(p, w, x);
    return vpadalq_s16(acc, p);
  }
};

}  // namespace

void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float32x4_t v[8];
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; ++j) {
      v[j] = vld1q_f32(xb + 4 * j);
      m = vmaxq_f32(m, vabsq_f32(v[j]));
    }
    const float amax = vmaxvq_f32(m);
    // The same f32 operations as ref::quantize_q8a; FCVTNS rounds to
    // nearest, ties to even, as nearbyint does in the default mode.
    d[b] = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32x4_t sum = vdupq_n_s32(0);
    int16x8_t q16[4];
    for (int j = 0; j < 4; ++j) {
      const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j], id));
      const int32x4_t c = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j + 1], id));
      sum = vaddq_s32(sum, vaddq_s32(a, c));
      q16[j] = vcombine_s16(vmovn_s32(a), vmovn_s32(c));
    }
    vst1q_s8(qs + b * kQK, vcombine_s8(vmovn_s16(q16[0]), vmovn_s16(q16[1])));
    vst1q_s8(qs + b * kQK + 16, vcombine_s8(vmovn_s16(q16[2]), vmovn_s16(q16[3])));
    s[b] = d[b] * static_cast<float>(vaddvq_s32(sum));
  }
}

void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  int8_gemv<WideningDot>(w, x, y, o_begin, o_end);
}

}  // namespace cb::neon
