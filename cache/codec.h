// Layer codecs: one layer of one chunk (its K and V) <-> one self-contained
// segment of bytes.  A segment is an 8-byte header followed by the codec's
// payload, zstd-compressed (q8, q4) when that makes it smaller:
//
//   u8 container (0 raw, 1 zstd) | u8 codec | u16 zero | u32 payload bytes before zstd
//
// Error bounds (x the input, x' the decoded value; tests check these):
//   f16: x' is exactly the f16 rounding of x.
//   q8:  per (token, head) group with a = max|x|:  |x'-x| <= a/254 + a*2^-10 + 2^-20
//   q4:  per group with range [lo, hi]:  |x'-x| <= (hi-lo)/30 + (|lo|+|hi|)*2^-10 + 2^-20
//        K groups: one channel over 32 consecutive tokens (K has per-channel
//        outliers, so its scale must follow channels); V groups: one (token, head).
// i.e. half a quantization step, plus the f16 rounding of the group's scale
// and offset.  Inputs must be finite and within the codec's range: |x| <=
// 65504 (f16's largest) for f16 and q4, 127 times that for q8 (whose f16 is
// the scale); encode throws kInvalidArgument otherwise.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/chunk_kv.h"

namespace cb::cache {

// What a store's reads decoded with one codec, for its stats.
struct CodecCounters {
  uint64_t layers = 0;        // layers decoded
  uint64_t output_bytes = 0;  // f16-equivalent bytes produced (2 per value)
  uint64_t decode_ns = 0;     // decompress + dequantize
};

// What a store has read since it opened: the loading controller learns a
// tier's read speed and a codec's decode cost from two of these.
struct ReadCounters {
  uint64_t bytes_read = 0;               // stored bytes of the layers read
  uint64_t read_ns = 0;                  // reading them, throttle waits included
  std::array<CodecCounters, 4> codec{};  // indexed by static_cast<int>(Codec)
};

constexpr int kQ4KGroupTokens = 32;
constexpr size_t kSegmentHeaderBytes = 8;

// Appends the segment for one layer to out.  zstd_level <= 0 disables zstd;
// f16 never uses it.
void encode_layer(Codec codec, const KvShape& shape, const float* k, const float* v, int zstd_level,
                  std::vector<uint8_t>& out);

// Decodes a segment into k_out and v_out (each n_tokens x kv_dim).  Throws
// cb::Error(kFormat) if the segment is malformed or does not match the codec
// and shape; it never reads or writes out of bounds.
void decode_layer(Codec codec, const KvShape& shape, const uint8_t* seg, size_t n, float* k_out,
                  float* v_out);

}  // namespace cb::cache
