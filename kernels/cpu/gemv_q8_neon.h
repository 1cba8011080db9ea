// The NEON int8 GEMV of decode (Backend::matmul_q8 for a few rows; the
// contract is ref::gemv_q8's) for any way of multiplying 16 signed byte
// pairs: gemv_q8_neon.cpp takes the baseline widening multiplies
// (SMULL/SMLAL2 into int16, at most 2 * 128 * 127 = 32512 a lane, then
// SADALP into int32), gemv_q8_dotprod.cpp SDOT.  Weights are unpacked to
// signed bytes in registers; each block's integer sum is exact whatever
// the instruction, and the scaled block sums accumulate in f32 in block
// order, so both give the same bits.  Everything here is in an anonymous
// namespace, and f16 scales widen through simd_neon.h's to_f32: each
// kernel file gets its own copy, compiled with its flags (the linkage rule
// in ops_avx2.h).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_neon.h"

namespace cb::neon {
namespace {

// Unsigned quants minus `bias`, as signed bytes.
inline void minus(Bytes32 q, uint8_t bias, int8x16_t* lo, int8x16_t* hi) {
  const uint8x16_t b = vdupq_n_u8(bias);
  *lo = vreinterpretq_s8_u8(vsubq_u8(q.lo, b));
  *hi = vreinterpretq_s8_u8(vsubq_u8(q.hi, b));
}

// The signed quants of one 32-element block as two 16-byte halves.
void q8_0_quants(const BlockQ8_0& b, int8x16_t* lo, int8x16_t* hi) {
  *lo = vld1q_s8(b.qs);
  *hi = vld1q_s8(b.qs + 16);
}
void q4_0_quants(const BlockQ4_0& b, int8x16_t* lo, int8x16_t* hi) {
  minus(nibbles32(b.qs), 8, lo, hi);
}
void q5_0_quants(const BlockQ5_0& b, int8x16_t* lo, int8x16_t* hi) {
  minus(q5_quants32(b.qs, b.qh), 16, lo, hi);
}

// The 32 signed levels of an IQ4 run of 16 nibble bytes (elements 0-15 in
// lo, 16-31 in hi), looked up by TBL.
inline void iq4_levels(const uint8_t* qs, int8x16_t* lo, int8x16_t* hi) {
  const int8x16_t t = vld1q_s8(kIq4Levels);
  const uint8x16_t v = vld1q_u8(qs);
  *lo = vqtbl1q_s8(t, vandq_u8(v, vdupq_n_u8(0x0F)));
  *hi = vqtbl1q_s8(t, vshrq_n_u8(v, 4));
}

void iq4_nl_quants(const BlockIQ4_NL& b, int8x16_t* lo, int8x16_t* hi) {
  iq4_levels(b.qs, lo, hi);
}

// Below, Dot::dot16(w, x, acc) is acc plus int32 lanes that sum to
// sum(w[i] * x[i]) over 16 bytes.

// sum(w * x) over one 32-element block given as two 16-byte halves.
template <class Dot>
int32_t dot32(int8x16_t w0, int8x16_t w1, const int8_t* x) {
  return vaddvq_s32(Dot::dot16(w1, vld1q_s8(x + 16), Dot::dot16(w0, vld1q_s8(x), vdupq_n_s32(0))));
}
template <class Dot>
int32_t dot16_sum(int8x16_t w, const int8_t* x) {
  return vaddvq_s32(Dot::dot16(w, vld1q_s8(x), vdupq_n_s32(0)));
}

// Q8_0, Q4_0 and IQ4_NL: one scale d per 32-element block, no offset.
template <class Dot, class Block, void (*kQuants)(const Block&, int8x16_t*, int8x16_t*)>
float row_scaled(const Block* w, const Q8Row& x, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t lo, hi;
    kQuants(w[b], &lo, &hi);
    acc += to_f32(w[b].d) * x.d[b] * static_cast<float>(dot32<Dot>(lo, hi, x.qs + kQK * b));
  }
  return acc;
}

// Q4_1 and Q5_1: a scale and an offset per block.
template <class Dot, class Block>
float row_offset(const Block* w, const Q8Row& x, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t lo, hi;
    if constexpr (std::is_same_v<Block, BlockQ5_1>) {
      minus(q5_quants32(w[b].qs, w[b].qh), 0, &lo, &hi);
    } else {
      minus(nibbles32(w[b].qs), 0, &lo, &hi);
    }
    acc += to_f32(w[b].d) * x.d[b] * static_cast<float>(dot32<Dot>(lo, hi, x.qs + kQK * b));
    acc += to_f32(w[b].m) * x.s[b];
  }
  return acc;
}

template <class Dot>
float row_iq4_xs(const BlockIQ4_XS* w, const Q8Row& x, int64_t n_super) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = to_f32(w[sb].d);
    for (int j = 0; j < kQKK / kQK; ++j) {
      int8x16_t lo, hi;
      iq4_levels(w[sb].qs + 16 * j, &lo, &hi);
      const int64_t xb = 8 * sb + j;
      acc += (d * static_cast<float>(iq4xs_scale(w[sb], j) - 32)) * x.d[xb] *
             static_cast<float>(dot32<Dot>(lo, hi, x.qs + kQK * xb));
    }
  }
  return acc;
}

// Q4_K and Q5_K: a scale and a min per sub-block of 32.
template <class Dot, class Block>
float row_q45_k(const Block* w, const Q8Row& x, int64_t n_super) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = to_f32(w[sb].d), dmin = to_f32(w[sb].dmin);
    const uint8_t* qh = nullptr;
    if constexpr (std::is_same_v<Block, BlockQ5_K>) qh = w[sb].qh;
    for (int j = 0; j < 8; ++j) {
      const Bytes32 q = q45_k_quants32(w[sb].qs, qh, j);
      uint8_t sc, m;
      q4k_scale_min(w[sb].scales, j, &sc, &m);
      const int64_t xb = 8 * sb + j;
      acc += (d * static_cast<float>(sc)) * x.d[xb] *
             static_cast<float>(
                 dot32<Dot>(vreinterpretq_s8_u8(q.lo), vreinterpretq_s8_u8(q.hi), x.qs + kQK * xb));
      acc -= (dmin * static_cast<float>(m)) * x.s[xb];
    }
  }
  return acc;
}

// Q2_K: per run of 16, a 4-bit scale (low) and a 4-bit min (high).
template <class Dot>
float row_q2_k(const BlockQ2_K* w, const Q8Row& x, int64_t n_super) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = to_f32(w[sb].d), dmin = to_f32(w[sb].dmin);
    for (int j = 0; j < 8; ++j) {
      const Bytes32 qb = q23_k_quants32(w[sb].qs, nullptr, j);
      const int8x16_t q[2] = {vreinterpretq_s8_u8(qb.lo), vreinterpretq_s8_u8(qb.hi)};
      const int64_t xb = 8 * sb + j;
      int32_t isum = 0, msum = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t sc = w[sb].scales[2 * j + h];
        isum += (sc & 0x0F) * dot16_sum<Dot>(q[h], x.qs + kQK * xb + 16 * h);
        msum += (sc >> 4) * vaddlvq_s8(vld1q_s8(x.qs + kQK * xb + 16 * h));
      }
      acc += (d * x.d[xb]) * static_cast<float>(isum) - (dmin * x.d[xb]) * static_cast<float>(msum);
    }
  }
  return acc;
}

// Q3_K: per run of 16, a 6-bit scale centred on 32.
template <class Dot>
float row_q3_k(const BlockQ3_K* w, const Q8Row& x, int64_t n_super) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = to_f32(w[sb].d);
    for (int j = 0; j < 8; ++j) {
      const Bytes32 qb = q23_k_quants32(w[sb].qs, w[sb].hmask, j);
      const int8x16_t q[2] = {vreinterpretq_s8_u8(qb.lo), vreinterpretq_s8_u8(qb.hi)};
      const int64_t xb = 8 * sb + j;
      int32_t isum = 0;
      for (int h = 0; h < 2; ++h)
        isum += (q3k_scale(w[sb].scales, 2 * j + h) - 32) *
                dot16_sum<Dot>(q[h], x.qs + kQK * xb + 16 * h);
      acc += (d * x.d[xb]) * static_cast<float>(isum);
    }
  }
  return acc;
}

template <class Dot>
float row_q6_k(const BlockQ6_K* w, const Q8Row& x, int64_t n_super) {
  const int8x16_t off = vdupq_n_s8(32);
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = to_f32(w[sb].d);
    for (int h = 0; h < 2; ++h) {
      const int8_t* sc = w[sb].scales + 8 * h;
      Bytes32 runs[4];
      q6_k_runs32(w[sb].ql + 64 * h, w[sb].qh + 32 * h, runs);
      int32_t isum[4] = {0, 0, 0, 0};  // per run of 32 elements
      for (int j = 0; j < 2; ++j) {    // elements 16j .. 16j + 15 of each run
        for (int r = 0; r < 4; ++r) {
          const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(j == 0 ? runs[r].lo : runs[r].hi), off);
          const int8_t* xq = x.qs + kQK * (8 * sb + 4 * h + r) + 16 * j;
          isum[r] += sc[2 * r + j] * dot16_sum<Dot>(q, xq);
        }
      }
      for (int r = 0; r < 4; ++r)
        acc += (d * x.d[8 * sb + 4 * h + r]) * static_cast<float>(isum[r]);
    }
  }
  return acc;
}

template <class Block, class Row>
void rows(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end,
          int64_t n_blocks, Row row) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = o_begin; o < o_end; ++o) {
    const Block* b = reinterpret_cast<const Block*>(base + static_cast<size_t>(o) * row_bytes);
    y[o] = row(b, x, n_blocks);
  }
}

// Output columns [o_begin, o_end) of y = W x.
template <class Dot>
void int8_gemv(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  const int64_t nb = w.n_in / kQK;
  switch (w.type) {
    case DType::Q8_0:
      return rows<BlockQ8_0>(w, x, y, o_begin, o_end, nb, &row_scaled<Dot, BlockQ8_0, q8_0_quants>);
    case DType::Q4_0:
      return rows<BlockQ4_0>(w, x, y, o_begin, o_end, nb, &row_scaled<Dot, BlockQ4_0, q4_0_quants>);
    case DType::Q4_1:
      return rows<BlockQ4_1>(w, x, y, o_begin, o_end, nb, &row_offset<Dot, BlockQ4_1>);
    case DType::Q5_0:
      return rows<BlockQ5_0>(w, x, y, o_begin, o_end, nb, &row_scaled<Dot, BlockQ5_0, q5_0_quants>);
    case DType::Q5_1:
      return rows<BlockQ5_1>(w, x, y, o_begin, o_end, nb, &row_offset<Dot, BlockQ5_1>);
    case DType::Q2_K:
      return rows<BlockQ2_K>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_q2_k<Dot>);
    case DType::Q3_K:
      return rows<BlockQ3_K>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_q3_k<Dot>);
    case DType::Q4_K:
      return rows<BlockQ4_K>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_q45_k<Dot, BlockQ4_K>);
    case DType::Q5_K:
      return rows<BlockQ5_K>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_q45_k<Dot, BlockQ5_K>);
    case DType::Q6_K:
      return rows<BlockQ6_K>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_q6_k<Dot>);
    case DType::IQ4_NL:
      return rows<BlockIQ4_NL>(w, x, y, o_begin, o_end, nb,
                               &row_scaled<Dot, BlockIQ4_NL, iq4_nl_quants>);
    case DType::IQ4_XS:
      return rows<BlockIQ4_XS>(w, x, y, o_begin, o_end, w.n_in / kQKK, &row_iq4_xs<Dot>);
    default:
      return;  // no int8 kernel (ref::gemv_q8_supported); the backend never calls this
  }
}

}  // namespace
}  // namespace cb::neon
