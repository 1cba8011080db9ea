// NEON versions of the row-wise and element-wise ops.
#include <cmath>

#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/simd_neon.h"

namespace cb::neon {

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      const float32x4_t a = vld1q_f32(xr + i), b = vld1q_f32(xr + i + 4);
      acc0 = vfmaq_f32(acc0, a, a);
      acc1 = vfmaq_f32(acc1, b, b);
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < dim; ++i) sum += xr[i] * xr[i];
    const float scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum) / static_cast<double>(dim) +
                                           static_cast<double>(eps)));
    i = 0;
    for (; i + 4 <= dim; i += 4) {
      vst1q_f32(yr + i, vmulq_f32(vmulq_n_f32(vld1q_f32(xr + i), scale), vld1q_f32(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t s = vdivq_f32(g, vaddq_f32(one, exp4(vnegq_f32(g))));
    vst1q_f32(out + i, vmulq_f32(s, vld1q_f32(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// gelu(x) = x / 2 * (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
void gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const float k = 1.5957691216057308f;  // 2 sqrt(2 / pi)
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t inner = vfmaq_f32(g, vmulq_n_f32(g, 0.044715f), vmulq_f32(g, g));
    const float32x4_t e = exp4(vmulq_n_f32(inner, -k));
    const float32x4_t y = vdivq_f32(g, vaddq_f32(one, e));
    vst1q_f32(out + i, vmulq_f32(y, vld1q_f32(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vaddq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void f32_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  for (; i < n; ++i) {
    const float16x4_t h = vcvt_f16_f32(vdupq_n_f32(src[i]));
    dst[i] = vget_lane_u16(vreinterpret_u16_f16(h), 0);
  }
}

void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
  for (; i < n; ++i)
    dst[i] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(src[i]))), 0);
}

}  // namespace cb::neon
