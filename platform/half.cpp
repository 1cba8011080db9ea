#include "platform/half.h"

#include "platform/cpu_features.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CB_HALF_X86 1
#endif

namespace cb {

uint16_t f32_to_f16(float x) {
  const uint32_t f = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaN a (quiet) NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): shift the full significand into place
    // and round to nearest even on the bits shifted out.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24 for this range
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even;
  // a carry out of the mantissa correctly bumps the exponent.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t f;
  if (exp == 0x1f) {
    f = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    f = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    f = sign;
  } else {
    // Subnormal: value is mant * 2^-24, exact in f32.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(f);
}

namespace {

// memcpy keeps unaligned access defined; compilers turn it into one move.
uint16_t load_f16(const char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

void store_f16(char* p, uint16_t h) {
  std::memcpy(p, &h, 2);
}

}  // namespace

#ifdef CB_HALF_X86
namespace {

__attribute__((target("f16c,avx"))) void to_f16_f16c(const float* src, char* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) store_f16(dst + 2 * i, f32_to_f16(src[i]));
}

__attribute__((target("f16c,avx"))) void to_f32_f16c(const char* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(load_f16(src + 2 * i));
}

bool have_f16c() {
  return cpu_features().f16c;
}

}  // namespace
#endif

void f32_to_f16_n(const float* src, void* dst, size_t n) {
  char* out = static_cast<char*>(dst);
#ifdef CB_HALF_X86
  if (have_f16c()) return to_f16_f16c(src, out, n);
#endif
  for (size_t i = 0; i < n; ++i) store_f16(out + 2 * i, f32_to_f16(src[i]));
}

void f16_to_f32_n(const void* src, float* dst, size_t n) {
  const char* in = static_cast<const char*>(src);
#ifdef CB_HALF_X86
  if (have_f16c()) return to_f32_f16c(in, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_f16(in + 2 * i));
}

}  // namespace cb
