// IEEE 754 binary16 ("f16") conversion.  Rounds to nearest, ties to even, and
// keeps subnormals, infinities and NaN, so an f32 -> f16 -> f32 round trip is
// exactly the f16 rounding of the input.  The bulk functions use the CPU's
// F16C instructions when present (same results, several times faster).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cb {

uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);

// The f16 side is raw bytes (n * 2 of them, any alignment), so callers can
// convert straight from a file buffer.
void f32_to_f16_n(const float* src, void* dst, size_t n);
void f16_to_f32_n(const void* src, float* dst, size_t n);

}  // namespace cb
