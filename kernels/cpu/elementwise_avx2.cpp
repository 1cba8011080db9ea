// AVX2 versions of the row-wise and element-wise ops.  Math goes through
// __builtin_* rather than std:: so no inline library function gets an
// AVX-encoded shared copy (see ops_avx2.h).
#include <cmath>

#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      acc0 = _mm256_fmadd_ps(a, a, acc0);
      acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < dim; ++i) sum += xr[i] * xr[i];
    const float scale = static_cast<float>(
        1.0 / __builtin_sqrt(static_cast<double>(sum) / static_cast<double>(dim) +
                             static_cast<double>(eps)));
    const __m256 vs = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= dim; i += 8) {
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vs),
                                             _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_xor_ps(g, sign));  // e^-g
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + __builtin_expf(-gate[i])) * up[i];
}

// gelu(x) = x / 2 * (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
void gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const float k = 1.5957691216057308f;  // 2 sqrt(2 / pi)
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 neg_k = _mm256_set1_ps(-k);
  const __m256 c = _mm256_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(c, g), _mm256_mul_ps(g, g), g);
    const __m256 e = exp256(_mm256_mul_ps(neg_k, inner));  // e^(-2u)
    const __m256 y = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(y, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + __builtin_expf(-k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void f32_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

}  // namespace cb::avx2
