#include "kernels/cpu/dequantize.h"

#include <string>
#include <type_traits>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/quant_blocks.h"
#include "platform/error.h"
#include "platform/half.h"

namespace cb {
namespace {

// Each block function writes one block's elements.  The expressions keep the
// operation order of ggml's dequantize_row_* (e.g. (d * sc) * q - dmin * m
// for Q4_K) so the results are bit-identical to the gguf oracle.

void block_q4_0(const BlockQ4_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const BlockQ4_1& b, float* y) {
  const float d = f16_to_f32(b.d);
  const float m = f16_to_f32(b.m);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
    y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

void block_q5_0(const BlockQ5_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int i = 0; i < kQK; ++i) y[i] = static_cast<float>(q5_quant(b.qs, b.qh, i) - 16) * d;
}

void block_q5_1(const BlockQ5_1& b, float* y) {
  const float d = f16_to_f32(b.d);
  const float m = f16_to_f32(b.m);
  for (int i = 0; i < kQK; ++i) y[i] = static_cast<float>(q5_quant(b.qs, b.qh, i)) * d + m;
}

void block_q8_0(const BlockQ8_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// Q4_K and Q5_K: one layout of scales and nibbles; Q5_K adds each element's
// fifth bit from qh (bit s of qh[l] for sub-block s).
template <class Block>
void block_q45_k(const Block& b, float* y) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5_K>;
  const float d = f16_to_f32(b.d);
  const float dmin = f16_to_f32(b.dmin);
  for (int c = 0; c < 4; ++c) {  // 4 chunks of 64 elements = 2 sub-blocks
    uint8_t sc_lo, m_lo, sc_hi, m_hi;
    q4k_scale_min(b.scales, 2 * c, &sc_lo, &m_lo);
    q4k_scale_min(b.scales, 2 * c + 1, &sc_hi, &m_hi);
    const float d_lo = d * sc_lo, min_lo = dmin * m_lo;
    const float d_hi = d * sc_hi, min_hi = dmin * m_hi;
    const uint8_t* q = b.qs + 32 * c;
    float* out = y + 64 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0x0F, hi = q[l] >> 4;
      if constexpr (kFifthBit) {
        lo |= ((b.qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      out[l] = d_lo * static_cast<float>(lo) - min_lo;
      out[l + 32] = d_hi * static_cast<float>(hi) - min_hi;
    }
  }
}

void block_q2_k(const BlockQ2_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  const float dmin = f16_to_f32(b.dmin);
  for (int e = 0; e < kQKK; ++e) {
    const int s = e / 32, r = e / 16, l = e % 32;
    const int q = (b.qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
    const float dl = d * static_cast<float>(b.scales[r] & 0x0F);
    const float ml = dmin * static_cast<float>(b.scales[r] >> 4);
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

void block_q3_k(const BlockQ3_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int e = 0; e < kQKK; ++e) {
    const int s = e / 32, r = e / 16, l = e % 32;
    const int q = (b.qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
    const int high = (b.hmask[l] >> s) & 1;
    const float dl = d * static_cast<float>(q3k_scale(b.scales, r) - 32);
    y[e] = dl * static_cast<float>(q - (high ? 0 : 4));
  }
}

void block_q6_k(const BlockQ6_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    const int8_t* sc = b.scales + 8 * half;
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int q0 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      const int g = l / 16;  // 16-element group within each 32-element run
      out[l] = d * static_cast<float>(sc[g]) * static_cast<float>(q0);
      out[l + 32] = d * static_cast<float>(sc[g + 2]) * static_cast<float>(q1);
      out[l + 64] = d * static_cast<float>(sc[g + 4]) * static_cast<float>(q2);
      out[l + 96] = d * static_cast<float>(sc[g + 6]) * static_cast<float>(q3);
    }
  }
}

// 32 elements from 16 bytes of nibbles (element j low, j + 16 high) at one
// scale, as ggml's dequantize_row_iq4_nl: d * level.
void iq4_run(const uint8_t* qs, float d, float* y) {
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(kIq4Levels[qs[j] & 0x0F]);
    y[j + kQK / 2] = d * static_cast<float>(kIq4Levels[qs[j] >> 4]);
  }
}

void block_iq4_nl(const BlockIQ4_NL& b, float* y) {
  iq4_run(b.qs, f16_to_f32(b.d), y);
}

void block_iq4_xs(const BlockIQ4_XS& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int s = 0; s < kQKK / kQK; ++s)
    iq4_run(b.qs + 16 * s, d * static_cast<float>(iq4xs_scale(b, s) - 32), y + kQK * s);
}

template <class Block, void (*kDecode)(const Block&, float*)>
void blocks(const void* src, float* dst, int64_t n_blocks, int64_t block_elems) {
  const Block* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n_blocks; ++i) kDecode(b[i], dst + i * block_elems);
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t be = dtype_block_elems(t);  // throws kUnsupported
  if (n < 0 || n % be != 0) {
    fail(ErrorCode::kInvalidArgument, "dequantize_row: " + std::to_string(n) +
                                          " is not a multiple of the " + dtype_name(t) +
                                          " block size");
  }
  const int64_t nb = n / be;
  switch (t) {
    case DType::F32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::F16:  // exact widening (F16C when available)
      return f16_to_f32_n(src, dst, static_cast<size_t>(n));
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::Q4_0:
      return blocks<BlockQ4_0, block_q4_0>(src, dst, nb, be);
    case DType::Q4_1:
      return blocks<BlockQ4_1, block_q4_1>(src, dst, nb, be);
    case DType::Q5_0:
      return blocks<BlockQ5_0, block_q5_0>(src, dst, nb, be);
    case DType::Q5_1:
      return blocks<BlockQ5_1, block_q5_1>(src, dst, nb, be);
    case DType::Q8_0:
      return blocks<BlockQ8_0, block_q8_0>(src, dst, nb, be);
    case DType::Q4_K:
      return blocks<BlockQ4_K, block_q45_k<BlockQ4_K>>(src, dst, nb, be);
    case DType::Q5_K:
      return blocks<BlockQ5_K, block_q45_k<BlockQ5_K>>(src, dst, nb, be);
    case DType::Q2_K:
      return blocks<BlockQ2_K, block_q2_k>(src, dst, nb, be);
    case DType::Q3_K:
      return blocks<BlockQ3_K, block_q3_k>(src, dst, nb, be);
    case DType::Q6_K:
      return blocks<BlockQ6_K, block_q6_k>(src, dst, nb, be);
    case DType::IQ4_NL:
      return blocks<BlockIQ4_NL, block_iq4_nl>(src, dst, nb, be);
    case DType::IQ4_XS:
      return blocks<BlockIQ4_XS, block_iq4_xs>(src, dst, nb, be);
  }
  fail(ErrorCode::kUnsupported, "dequantize_row: unsupported type");
}

}  // namespace cb
