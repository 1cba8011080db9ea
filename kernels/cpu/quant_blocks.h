// On-disk block layouts of the quantized GGUF types, byte for byte as ggml
// writes them.  A row of n elements is n / block_elems consecutive blocks.
// Scales are binary16 stored as raw bits (platform/half.h).  All members are at
// even offsets and GGUF aligns tensor data to at least 8 bytes, so reading
// rows through these structs is aligned.
#pragma once

#include <cstdint>

namespace cb {

inline constexpr int kQK = 32;    // elements per Q4_0 / Q4_1 / Q8_0 block
inline constexpr int kQKK = 256;  // elements per K-quant super-block

// x[i] = (q[i] - 8) * d.  Byte j holds element j in its low nibble and
// element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};

// x[i] = q[i] * d + m, nibbles arranged as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};

// Q4_0 with a fifth bit: x[i] = (q[i] - 16) * d, q[i] = nibble as in Q4_0
// | bit i of the little-endian 32-bit qh << 4.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};

// x[i] = q[i] * d + m, the 5-bit q[i] as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};

// The 5-bit quant of element i (0..31) of a Q5_0 / Q5_1 block.
inline int q5_quant(const uint8_t* qs, const uint8_t* qh, int i) {
  const uint32_t h = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                     static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
  const int nibble = i < kQK / 2 ? qs[i] & 0x0F : qs[i - kQK / 2] >> 4;
  return nibble | static_cast<int>((h >> i) & 1u) << 4;
}

// x[i] = q[i] * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};

// 8 sub-blocks of 32 elements; sub-block s has a 6-bit scale sc[s] and a
// 6-bit min m[s] packed into `scales` (see q4k_scale_min), and
// x = (d * sc[s]) * q - (dmin * m[s]).  The 4-bit quants come in 4 chunks of
// 32 bytes: chunk c holds sub-block 2c in the low nibbles and sub-block
// 2c + 1 in the high nibbles.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};

// Q4_K with a fifth bit per element: sub-block s (elements 32 s .. 32 s + 31,
// quants in chunk s / 2 as in Q4_K) takes bit s of qh[l] for its element l,
// and x = (d * sc[s]) * (q + 16 * bit) - (dmin * m[s]).
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};

// Q2_K and Q3_K: 16 runs of 16 elements.  Sub-block s (elements 32 s ..
// 32 s + 31) takes 2-bit quants from bits 2 (s % 4) of qs[32 (s / 4) + e]
// for its element e, and run r = 2 s + e / 16 has its own scale.
// Q2_K: scales[r] holds a 4-bit scale (low) and a 4-bit min (high), and
// x = (d * scale) * q - (dmin * min).
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};

// Q3_K: a third bit, bit s of hmask[e], set means +0 and clear means -4;
// 6-bit scales packed in 12 bytes (q3k_scale), centred on 32:
// x = (d * (scale - 32)) * (q - (bit ? 0 : 4)).
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};

// Run r's (0..15) 6-bit scale of a Q3_K block: its low 4 bits are the low
// (r < 8) or high nibble of scales[r % 8], its high 2 bits bits 2 (r / 4) of
// scales[8 + r % 4].
inline int q3k_scale(const uint8_t* scales, int r) {
  const int low = r < 8 ? scales[r] & 0x0F : scales[r - 8] >> 4;
  const int high = (scales[8 + r % 4] >> (2 * (r / 4))) & 3;
  return low | high << 4;
}

// 16 groups of 16 elements; element e has the signed 6-bit quant
// q = (4 low bits from ql) | (2 high bits from qh) - 32 and
// x = (d * scales[e / 16]) * q.  Each half of 128 elements uses 64 bytes of
// ql and 32 bytes of qh; within a half, for l < 32:
//   element l      : ql[l]      low nibble,  qh[l] bits 0-1
//   element l + 32 : ql[l + 32] low nibble,  qh[l] bits 2-3
//   element l + 64 : ql[l]      high nibble, qh[l] bits 4-5
//   element l + 96 : ql[l + 32] high nibble, qh[l] bits 6-7
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};

// The 16 levels of the non-linear 4-bit types: a quant q stands for
// kIq4Levels[q] times the block's (or sub-block's) scale.  A macro as well,
// for the copy CUDA device code keeps in constant memory.
#define CB_IQ4_LEVELS -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
inline constexpr int8_t kIq4Levels[16] = {CB_IQ4_LEVELS};

// x[i] = d * kIq4Levels[q[i]], nibbles arranged as in Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};

// 8 sub-blocks of 32, each as an IQ4_NL block whose scale is
// d * (ls - 32): ls is 6 bits, the low 4 in nibble s % 2 of scales_l[s / 2]
// and the high 2 in bits 2s, 2s + 1 of scales_h (iq4xs_scale).
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};

inline int iq4xs_scale(const BlockIQ4_XS& b, int s) {
  return ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | ((b.scales_h >> (2 * s)) & 3) << 4;
}

// An activation row quantized for the int8 GEMV of decode (not a GGUF
// type), n elements in blocks of 32: x[i] ~= qs[i] * d[i / 32] with
// d = max|x| / 127 over the block and qs[i] the nearest integer to
// x[i] / d; s[b] = d[b] * sum(block b's qs) carries the block's sum for the
// weight types with an offset (Q4_1's m, Q5_1's m, the K-quants' mins).
// The blocks are 32 elements, the sub-block size of every quantized weight
// type, so one activation scale meets exactly one weight scale (two for the
// runs of 16 of Q2_K, Q3_K and Q6_K, which stay integer until the end).
// Three arrays rather than one array of blocks: a SIMD kernel loads the 8
// scales of a K-quant super-block's activations at once.
struct Q8Row {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);

// Scale and min of Q4_K sub-block s (0..7).  Bytes 0-3 hold the 6-bit scales
// of sub-blocks 0-3 and bytes 4-7 their mins; sub-blocks 4-7 keep their low
// 4 bits in the nibbles of bytes 8-11 (scale low, min high) and their top
// 2 bits in the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
// `static inline`: the AVX2 kernels use it too (see ops_avx2.h).
static inline void q4k_scale_min(const uint8_t* scales, int s, uint8_t* sc, uint8_t* m) {
  if (s < 4) {
    *sc = scales[s] & 63u;
    *m = scales[s + 4] & 63u;
  } else {
    *sc = static_cast<uint8_t>((scales[s + 4] & 0x0Fu) | ((scales[s - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

// The 6-bit scales and mins of all 8 Q4_K / Q5_K sub-blocks at once (the
// same values as q4k_scale_min), byte s of *sc and *m for sub-block s, by
// word operations on the 12 bytes: no shift carries a bit into a kept
// position of another byte.
static inline void q4k_scales_mins(const uint8_t* scales, uint64_t* sc, uint64_t* m) {
  uint32_t a, b, c;
  __builtin_memcpy(&a, scales, 4);
  __builtin_memcpy(&b, scales + 4, 4);
  __builtin_memcpy(&c, scales + 8, 4);
  const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  *sc = sc_lo | static_cast<uint64_t>(sc_hi) << 32;
  *m = m_lo | static_cast<uint64_t>(m_hi) << 32;
}

}  // namespace cb
