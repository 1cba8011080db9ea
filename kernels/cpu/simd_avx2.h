// Small AVX2 helpers shared by the *_avx2.cpp kernels.  Include only from
// files compiled with -mavx2 -mfma -mf16c.  Everything here has internal
// linkage (`static inline`), see the linkage rule in ops_avx2.h.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace cb::avx2 {

// Sum of the 8 lanes.
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Maximum of the 8 lanes.
static inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// The lane sums of four vectors, as one 4-lane vector {sum(a), .., sum(d)}.
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 ..
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// e^x for each lane, relative error about 1e-7.  x = n ln2 + r with
// |r| <= ln2/2; e^r by its degree-7 Taylor polynomial (truncation error
// < 1e-8); 2^n built in the exponent field.  Inputs are clamped to
// [-87.3, 88], so the result is always a finite normal number: a very
// negative x gives ~1e-38 rather than 0, which is harmless for softmax
// weights and SiLU.
static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 split in a high part with few mantissa bits (n * hi is exact) and
  // the remainder, so r keeps full precision.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Transposes the 8 x 8 block src[i * lds + j] into dst[j * ldd + i].
// Eight consecutive elements as floats: f32, or f16 bits widened (exact).
static inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
static inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline float to_f32(float x) {
  return x;
}
static inline float to_f32(uint16_t h) {
  return _cvtsh_ss(h);
}

template <class T>
static inline void transpose8(const T* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = load8(src + i * lds);
  // Interleave pairs of rows, then pairs of pairs, then the 128-bit halves.
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

// One half (128 elements) of a Q6_K super-block as four runs of 32 unsigned
// 6-bit values (layout: see BlockQ6_K): the low nibbles come from ql (l0 =
// bytes 0-31, l1 = bytes 32-63 of the half), the two high bits from qh,
// moved to bits 4-5 by shifts that cannot carry into a neighbouring byte
// because they are masked first.
static inline void unpack_q6_k_runs(__m256i l0, __m256i l1, __m256i qh, __m256i runs[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  runs[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
  runs[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
  runs[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                            _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
  runs[3] = _mm256_or_si256(
      _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
      _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
}

}  // namespace cb::avx2
