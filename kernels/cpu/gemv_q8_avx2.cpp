// AVX2 int8 GEMV for decode: weights stay in their GGUF blocks, the
// activation row is quantized to int8 blocks of 32 (BlockQ8A), and each
// block's dot product is taken in integers: VPMADDUBSW multiplies unsigned
// weight bytes by signed activation bytes and adds pairs into int16, VPMADDWD
// adds pairs again into int32 (or applies Q6_K's per-16 scales on the way).
// Per 32 weights that is a handful of instructions, against the f32 path's
// widening of every weight to f32 and four FMAs; on 2 cores the f32 GEMV
// was bound by those instructions (kernel_bench: ~5 GB/s of Q4_1 weights,
// cache-resident or not), the int8 one is ~1.6x faster per CPU-second, and
// with it the memory stalls of the largest matrix show (see the prefetch in
// gemv_blocks).  Signed weights (Q8_0, Q4_0, Q6_K, IQ4) go through the usual sign
// trick, |w| * (x * sign(w)).  No int16 sum can saturate: |w| <= 128 and
// |x| <= 127 give at most 2 * 128 * 127 = 32512 per pair.
//
// Same results as ref::gemv_q8 up to f32 summation order: the integer sums
// are exact, and the per-block scale products are formed as there.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Eight int32 partial sums of w[i] * x[i] over 32 bytes, w unsigned.
inline __m256i dot_u8s8(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
// The same with w signed.
inline __m256i dot_s8s8(__m256i w, __m256i x) {
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// acc += isum * scale, lane-wise.
inline __m256 fma_block(__m256i isum, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

// Q8_0, Q4_0 and Q4_1: one 32-element weight block per activation block.
// Each type gives the block's integer dot product with the activation
// bytes, its scale and (Q4_1) its offset.
struct DotQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kOffset = false;
  static __m256i dot(const Block& b, __m256i x) { return dot_s8s8(load32(b.qs), x); }
};
struct DotQ4_0 {
  using Block = BlockQ4_0;
  static constexpr bool kOffset = false;
  static __m256i dot(const Block& b, __m256i x) {
    return dot_s8s8(_mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)), x);
  }
};
struct DotQ4_1 {
  using Block = BlockQ4_1;
  static constexpr bool kOffset = true;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(nibbles32(b.qs), x); }
};
static_assert(offsetof(BlockQ4_1, m) == offsetof(BlockQ4_1, d) + 2);
struct DotQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kOffset = false;
  static __m256i dot(const Block& b, __m256i x) {
    return dot_s8s8(_mm256_sub_epi8(q5_quants32(b.qs, b.qh), _mm256_set1_epi8(16)), x);
  }
};
struct DotQ5_1 {
  using Block = BlockQ5_1;
  static constexpr bool kOffset = true;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(q5_quants32(b.qs, b.qh), x); }
};
static_assert(offsetof(BlockQ5_1, m) == offsetof(BlockQ5_1, d) + 2);

// The 32 signed levels of an IQ4 run of 16 nibble bytes, in element order:
// one byte shuffle looks all of them up.
inline __m256i iq4_levels32(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Levels));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles32(qs));
}
struct DotIQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr bool kOffset = false;
  static __m256i dot(const Block& b, __m256i x) { return dot_s8s8(iq4_levels32(b.qs), x); }
};

// R output rows at once: each activation block is loaded once for all R
// rows, and the R accumulator chains are independent, so the FMA latency is
// hidden without splitting a row's sum.  Every row gets the same chain of
// operations whatever R is (one accumulator, blocks in order), so the
// result does not depend on how rows are grouped or split over threads.
template <class T, int R>
void rows_blocks(const uint8_t* base, size_t row_bytes, const BlockQ8A* x, int64_t nb, float* y) {
  using Block = typename T::Block;
  const Block* w[R];
  __m256 acc[R];
  float off[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const Block*>(base + static_cast<size_t>(r) * row_bytes);
    acc[r] = _mm256_setzero_ps();
    off[r] = 0.0f;
  }
  if constexpr (T::kOffset) {
    // Q4_1's d and m are adjacent: one conversion gives both (lanes 0, 1),
    // and lane 1 of offv accumulates m * s (lane 0's d * s is unused).
    __m128 offv[R];
    for (int r = 0; r < R; ++r) offv[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xv = load32(x[b].qs);
      const __m128 xd = _mm_set_ss(x[b].d), xs = _mm_set1_ps(x[b].s);
      for (int r = 0; r < R; ++r) {
        uint32_t dm_bits;
        __builtin_memcpy(&dm_bits, &w[r][b].d, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm_bits)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T::dot(w[r][b], xv)),
                                 _mm256_broadcastss_ps(_mm_mul_ss(dm, xd)), acc[r]);
        offv[r] = _mm_fmadd_ps(dm, xs, offv[r]);
      }
    }
    for (int r = 0; r < R; ++r) off[r] = _mm_cvtss_f32(_mm_movehdup_ps(offv[r]));
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xv = load32(x[b].qs);
      const float xd = x[b].d;
      for (int r = 0; r < R; ++r)
        acc[r] = fma_block(T::dot(w[r][b], xv), half(w[r][b].d) * xd, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]) + off[r];
}

template <class T>
void gemv_blocks(const WeightView& w, const BlockQ8A* x, float* y, int64_t o_begin, int64_t o_end) {
  constexpr int kRows = 4;
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.n_in / kQK;
  // The weights stream from memory once per token (SmolLM2's are ~100 MB,
  // far beyond the caches); prefetching the row group kAhead groups ahead
  // measured ~15 % faster than the hardware prefetcher alone on a DRAM-sized
  // matrix (kernel_bench, one thread).
  constexpr int64_t kAhead = 2;
  const size_t group_bytes = kRows * row_bytes;
  int64_t o = o_begin;
  for (; o + kRows <= o_end; o += kRows) {
    if (o + (kAhead + 1) * kRows <= o_end) {
      const char* next =
          reinterpret_cast<const char*>(base) + static_cast<size_t>(o + kAhead * kRows) * row_bytes;
      for (size_t off = 0; off < group_bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    }
    rows_blocks<T, kRows>(base + static_cast<size_t>(o) * row_bytes, row_bytes, x, nb, y + o);
  }
  for (; o < o_end; ++o)
    rows_blocks<T, 1>(base + static_cast<size_t>(o) * row_bytes, row_bytes, x, nb, y + o);
}

// Q4_K and Q5_K: a scale and a min per sub-block of 32.
template <class Block>
float row_q45_k(const Block* w, const BlockQ8A* x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = half(w[sb].d), dmin = half(w[sb].dmin);
    const uint8_t* qh = nullptr;
    if constexpr (std::is_same_v<Block, BlockQ5_K>) qh = w[sb].qh;
    const BlockQ8A* xs = x + 8 * sb;
    for (int j = 0; j < 8; j += 2) {
      uint8_t sc0, m0, sc1, m1;
      q4k_scale_min(w[sb].scales, j, &sc0, &m0);
      q4k_scale_min(w[sb].scales, j + 1, &sc1, &m1);
      const BlockQ8A& x0 = xs[j];
      const BlockQ8A& x1 = xs[j + 1];
      acc0 = fma_block(dot_u8s8(q45_k_quants32(w[sb].qs, qh, j), load32(x0.qs)),
                       (d * static_cast<float>(sc0)) * x0.d, acc0);
      acc1 = fma_block(dot_u8s8(q45_k_quants32(w[sb].qs, qh, j + 1), load32(x1.qs)),
                       (d * static_cast<float>(sc1)) * x1.d, acc1);
      mins = __builtin_fmaf(dmin * static_cast<float>(m0), x0.s, mins);
      mins = __builtin_fmaf(dmin * static_cast<float>(m1), x1.s, mins);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - mins;
}

// The int16 pair sums of a 32-element run whose two halves have their own
// scales (Q2_K, Q3_K, Q6_K): VPMADDWD applies them while it widens (int16
// lanes 0-7 hold elements 0-15, lanes 8-15 elements 16-31).
inline __m256i scale_halves(__m256i p16, int scale_a, int scale_b) {
  return _mm256_madd_epi16(p16, _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(scale_b)),
                                                 _mm_set1_epi16(static_cast<int16_t>(scale_a))));
}

// Q2_K: per run of 16, a 4-bit scale and a 4-bit min.
float row_q2_k(const BlockQ2_K* w, const BlockQ8A* x, int64_t n_super) {
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = half(w[sb].d), dmin = half(w[sb].dmin);
    for (int j = 0; j < 8; ++j) {
      const BlockQ8A& xb = x[8 * sb + j];
      const __m256i xv = load32(xb.qs);
      const uint8_t sa = w[sb].scales[2 * j], sb_ = w[sb].scales[2 * j + 1];
      const __m256i isum = scale_halves(
          _mm256_maddubs_epi16(q23_k_quants32(w[sb].qs, nullptr, j), xv), sa & 0x0F, sb_ & 0x0F);
      const __m256i mins = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(sb_ >> 4)),
                                            _mm_set1_epi8(static_cast<char>(sa >> 4)));
      acc = fma_block(isum, d * xb.d, acc);
      acc_min = fma_block(dot_u8s8(mins, xv), dmin * xb.d, acc_min);
    }
  }
  return hsum(acc) - hsum(acc_min);
}

// Q3_K: per run of 16, a 6-bit scale centred on 32; signed quants.
float row_q3_k(const BlockQ3_K* w, const BlockQ8A* x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = half(w[sb].d);
    for (int j = 0; j < 8; ++j) {
      const BlockQ8A& xb = x[8 * sb + j];
      const __m256i q = q23_k_quants32(w[sb].qs, w[sb].hmask, j);
      const __m256i p16 =
          _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(xb.qs), q));
      const __m256i isum = scale_halves(p16, q3k_scale(w[sb].scales, 2 * j) - 32,
                                        q3k_scale(w[sb].scales, 2 * j + 1) - 32);
      if (j % 2 == 0) {
        acc0 = fma_block(isum, d * xb.d, acc0);
      } else {
        acc1 = fma_block(isum, d * xb.d, acc1);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

float row_q6_k(const BlockQ6_K* w, const BlockQ8A* x, int64_t n_super) {
  const __m256i off = _mm256_set1_epi8(32);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = half(w[sb].d);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load32(w[sb].ql + 64 * h);
      const __m256i l1 = load32(w[sb].ql + 64 * h + 32);
      const __m256i qh = load32(w[sb].qh + 32 * h);
      __m256i runs[4];
      unpack_q6_k_runs(l0, l1, qh, runs);
      const int8_t* sc = w[sb].scales + 8 * h;
      for (int r = 0; r < 4; ++r) {
        const BlockQ8A& xb = x[8 * sb + 4 * h + r];
        const __m256i q = _mm256_sub_epi8(runs[r], off);
        const __m256i p16 =
            _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(xb.qs), q));
        const __m256i isum = scale_halves(p16, sc[2 * r], sc[2 * r + 1]);
        if (r % 2 == 0) {
          acc0 = fma_block(isum, d * xb.d, acc0);
        } else {
          acc1 = fma_block(isum, d * xb.d, acc1);
        }
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

float row_iq4_xs(const BlockIQ4_XS* w, const BlockQ8A* x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = half(w[sb].d);
    for (int j = 0; j < kQKK / kQK; j += 2) {
      const BlockQ8A& x0 = x[8 * sb + j];
      const BlockQ8A& x1 = x[8 * sb + j + 1];
      const float s0 = d * static_cast<float>(iq4xs_scale(w[sb], j) - 32);
      const float s1 = d * static_cast<float>(iq4xs_scale(w[sb], j + 1) - 32);
      acc0 = fma_block(dot_s8s8(iq4_levels32(w[sb].qs + 16 * j), load32(x0.qs)), s0 * x0.d, acc0);
      acc1 =
          fma_block(dot_s8s8(iq4_levels32(w[sb].qs + 16 * j + 16), load32(x1.qs)), s1 * x1.d, acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

template <class Block, float (*Row)(const Block*, const BlockQ8A*, int64_t)>
void rows(const WeightView& w, const BlockQ8A* x, float* y, int64_t o_begin, int64_t o_end,
          int64_t n_blocks) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  // (No software prefetch here: on Q4_K / Q6_K rows it measured no gain
  // over the hardware prefetcher, unlike gemv_blocks.)
  for (int64_t o = o_begin; o < o_end; ++o) {
    const Block* b = reinterpret_cast<const Block*>(base + static_cast<size_t>(o) * row_bytes);
    y[o] = Row(b, x, n_blocks);
  }
}

}  // namespace

void quantize_q8a(const float* x, int64_t n, BlockQ8A* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    const __m256 v[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                         _mm256_loadu_ps(xb + 24)};
    const __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    // The same f32 operations as ref::quantize_q8a, so the same bytes; the
    // conversion rounds in the current mode (nearest even), as nearbyint.
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
    const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    // Saturating packs interleave the 128-bit lanes; the permute restores
    // element order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), p8);
    out[b].d = d;
    out[b].s = d * static_cast<float>(_mm_cvtsi128_si32(s));
  }
}

void gemv_q8(const WeightView& w, const BlockQ8A* x, float* y, int64_t o_begin, int64_t o_end) {
  switch (w.type) {
    case DType::Q8_0:
      return gemv_blocks<DotQ8_0>(w, x, y, o_begin, o_end);
    case DType::Q4_0:
      return gemv_blocks<DotQ4_0>(w, x, y, o_begin, o_end);
    case DType::Q4_1:
      return gemv_blocks<DotQ4_1>(w, x, y, o_begin, o_end);
    case DType::Q5_0:
      return gemv_blocks<DotQ5_0>(w, x, y, o_begin, o_end);
    case DType::Q5_1:
      return gemv_blocks<DotQ5_1>(w, x, y, o_begin, o_end);
    case DType::Q2_K:
      return rows<BlockQ2_K, row_q2_k>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    case DType::Q3_K:
      return rows<BlockQ3_K, row_q3_k>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    case DType::Q4_K:
      return rows<BlockQ4_K, row_q45_k<BlockQ4_K>>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    case DType::Q5_K:
      return rows<BlockQ5_K, row_q45_k<BlockQ5_K>>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    case DType::Q6_K:
      return rows<BlockQ6_K, row_q6_k>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    case DType::IQ4_NL:
      return gemv_blocks<DotIQ4_NL>(w, x, y, o_begin, o_end);
    case DType::IQ4_XS:
      return rows<BlockIQ4_XS, row_iq4_xs>(w, x, y, o_begin, o_end, w.n_in / kQKK);
    default:
      return;  // no int8 kernel (ref::gemv_q8_supported); the backend never calls this
  }
}

}  // namespace cb::avx2
