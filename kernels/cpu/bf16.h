// bfloat16 <-> f32.  (IEEE binary16 lives in platform/half.h, shared with the
// KV cache codecs.)
//
// `static inline` on purpose: helpers that the *_avx2.cpp files may include
// must have internal linkage, see ops_avx2.h.
#pragma once

#include <bit>
#include <cstdint>

namespace cb {

// bfloat16 is the top half of an f32, so widening is a shift (exact).
static inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Round to nearest, ties to even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace cb
