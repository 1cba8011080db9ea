// Small AVX2 helpers shared by the *_avx2.cpp and *_avx512.cpp kernels.
// Include only from files compiled with -mavx2 -mfma -mf16c (or more).  Everything here has
// internal linkage (`static inline`), see the linkage rule in ops_avx2.h.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/quant_blocks.h"

namespace cb::avx2 {

// An f16 (raw bits) as f32, exactly.
static inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}

// 32 bytes from p, unaligned.
static inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

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

// 32 bytes: byte i is 0xFF where bit i of `bits` is set, else 0.  Each
// 128-bit lane takes its bytes of `bits` by a shuffle (bytes 0-7 of the
// result from byte 0, ...), then every byte tests its own bit.
static inline __m256i bit_mask_bytes(uint32_t bits) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

// 0xFF in the bytes of v that have bit `bit_value` (a power of two) set.
static inline __m256i bytes_with_bit(__m256i v, int bit_value) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(bit_value));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, b), b);
}

// The 32 nibbles of a 32-element block (Q4_0, Q4_1, Q5_*, IQ4_NL) in element
// order: the low nibbles of the 16 bytes are elements 0-15, the high ones
// 16-31.
static inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

// The 32 signed levels of an IQ4 run of 16 nibble bytes, in element order:
// one byte shuffle looks all of them up.
static inline __m256i iq4_levels32(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Levels));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles32(qs));
}

// The 32 unsigned 5-bit quants of a Q5_0 / Q5_1 block in element order.
// (In a file compiled for AVX-512 BW and VL, a masked add sets the bits.)
static inline __m256i q5_quants32(const uint8_t* qs, const uint8_t* qh) {
  uint32_t bits;
  __builtin_memcpy(&bits, qh, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  const __m256i low = nibbles32(qs);
  return _mm256_mask_add_epi8(low, static_cast<__mmask32>(bits), low, _mm256_set1_epi8(0x10));
#else
  return _mm256_or_si256(nibbles32(qs),
                         _mm256_and_si256(bit_mask_bytes(bits), _mm256_set1_epi8(0x10)));
#endif
}

// Sub-block j (0..7) of a Q4_K / Q5_K super-block as 32 unsigned quants
// (layout: see BlockQ4_K, BlockQ5_K); `qh` is null for Q4_K.
static inline __m256i q45_k_quants32(const uint8_t* qs, const uint8_t* qh, int j) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
  __m256i q = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  if (qh != nullptr) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    q = _mm256_or_si256(q, _mm256_and_si256(bytes_with_bit(h, 1 << j), _mm256_set1_epi8(0x10)));
  }
  return q;
}

// Sub-block j (0..7) of a Q2_K / Q3_K super-block as 32 quants (layout: see
// BlockQ2_K): the 2-bit values for Q2_K (hmask null), the signed values
// q - 4 * !bit in [-4, 3] for Q3_K.  The shift may move bits across bytes,
// but the two kept bits of each byte come from that byte.
static inline __m256i q23_k_quants32(const uint8_t* qs, const uint8_t* hmask, int j) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 4)));
  const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (j % 4)), _mm256_set1_epi8(3));
  if (hmask == nullptr) return q;
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hmask));
  return _mm256_sub_epi8(q, _mm256_andnot_si256(bytes_with_bit(h, 1 << j), _mm256_set1_epi8(4)));
}

// 32 quant bytes in a ymm, as the int8 GEMM's decoders and packing take
// them (gemm_q8_tiles.h).  In an anonymous namespace: its members are
// compiled apart in every file, as the linkage rule asks.
namespace {
struct Quants32 {
  using Bytes = __m256i;
  static Bytes load(const void* p) { return load32(p); }
  static Bytes nibbles(const uint8_t* qs) { return nibbles32(qs); }
  static Bytes q5_quants(const uint8_t* qs, const uint8_t* qh) { return q5_quants32(qs, qh); }
  static Bytes iq4_levels(const uint8_t* qs) { return iq4_levels32(qs); }
  static Bytes q23_k_quants(const uint8_t* qs, const uint8_t* hmask, int j) {
    return q23_k_quants32(qs, hmask, j);
  }
  static Bytes q45_k_quants(const uint8_t* qs, const uint8_t* qh, int j) {
    return q45_k_quants32(qs, qh, j);
  }
  // One half of a Q6_K super-block (ql: its 64 bytes, qh: its 32) as four
  // runs of 32.
  static void q6_k_runs(const uint8_t* ql, const uint8_t* qh, Bytes runs[4]) {
    unpack_q6_k_runs(load32(ql), load32(ql + 32), load32(qh), runs);
  }
  // Signed bytes as unsigned: + 128.
  static Bytes flip_sign(Bytes v) { return _mm256_xor_si256(v, _mm256_set1_epi8(-128)); }
  static Bytes plus(Bytes v, int n) {
    return _mm256_add_epi8(v, _mm256_set1_epi8(static_cast<char>(n)));
  }
  static void store(uint8_t* p, Bytes v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static float half(uint16_t h) { return avx2::half(h); }
  // 16 rows of 8 dwords (row i at src + i * lds) into 8 rows of 16.
  static void transpose16x8(const float* src, int64_t lds, float* dst) {
    transpose8(src, lds, dst, 16);
    transpose8(src + 8 * lds, lds, dst + 8, 16);
  }
};
}  // namespace

}  // namespace cb::avx2
