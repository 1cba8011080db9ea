// Internal to the codecs: each codec's uncompressed payload.  codec.cpp wraps
// these in the segment header and zstd.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache/chunk_kv.h"

namespace cb::cache::detail {

// Exact payload size for a shape; decode checks it before touching data.
size_t f16_payload_bytes(const KvShape& s);
size_t q8_payload_bytes(const KvShape& s);
size_t q4_payload_bytes(const KvShape& s);

// Encoders write exactly *_payload_bytes into dst.
void f16_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst);
void q8_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst);
void q4_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst);

void f16_decode(const KvShape& s, const uint8_t* src, float* k, float* v);
void q8_decode(const KvShape& s, const uint8_t* src, float* k, float* v);
void q4_decode(const KvShape& s, const uint8_t* src, float* k, float* v);

// Scale/offset helpers shared by the quantizing codecs.  Rounding the scale
// up and the offset down keeps every input inside the quantization range.
uint16_t f16_round_up(float x);    // smallest f16 >= x (x finite, >= 0)
uint16_t f16_round_down(float x);  // largest f16 <= x
// Throws kInvalidArgument unless every value is finite and within f16 range.
void check_finite(const float* x, size_t n, float limit);

}  // namespace cb::cache::detail
