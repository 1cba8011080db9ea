// AVX2 matmul for every weight type: y = x * W^T with f32 activations.
//
// Each weight type has a row decoder that turns a range of a weight row into
// f32 vectors, 32 elements at a time, and hands them to a sink:
//  * GEMV (n_rows == 1; decode itself uses gemv_q8_avx2.cpp unless asked for
//    f32): the sink multiplies the decoded vectors into
//    the activation row at once, so the weight is read exactly once and never
//    stored (fused dequantize+dot); Q4_0/Q4_1/Q8_0 factor each block's scale
//    and offset out of the dot product instead (see gemv_blocks).
//  * GEMM (prefill, n_rows > 1): the sink stores weight rows into a per-thread
//    buffer, from which they are transposed into packed f32 panels that a
//    6x16 register-tiled micro-kernel multiplies by every activation row
//    (see "GEMM" below), so each weight block is dequantized once per call.
// Work is split by the caller over output columns, and every output element
// is computed by the same sequence of operations whatever the split, so the
// result does not depend on the thread count.
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "kernels/cpu/gemm_panels.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/dtype.h"

namespace cb::avx2 {
namespace {

inline __m256 i8_to_ps(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// Decoders.  decode(row, k0, k1, sink) calls sink.vec(k, w0, w1, w2, w3) with
// the weights of elements k..k+31 for each 32-element run in [k0, k1), and
// sink.one(k, w) for a tail shorter than 32 (float types only; quantized rows
// are whole blocks).  k0 and k1 are multiples of the block size.

struct DecodeF32 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const float* p = static_cast<const float*>(row);
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) {
      s.vec(k, _mm256_loadu_ps(p + k), _mm256_loadu_ps(p + k + 8), _mm256_loadu_ps(p + k + 16),
            _mm256_loadu_ps(p + k + 24));
    }
    for (; k < k1; ++k) s.one(k, p[k]);
  }
};

struct DecodeF16 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const uint16_t* p = static_cast<const uint16_t*>(row);
    auto ld = [p](int64_t k) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k)));
    };
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) s.vec(k, ld(k), ld(k + 8), ld(k + 16), ld(k + 24));
    for (; k < k1; ++k) s.one(k, half(p[k]));
  }
};

struct DecodeBF16 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const uint16_t* p = static_cast<const uint16_t*>(row);
    // bf16 is the top half of an f32: widen to 32 bits and shift.
    auto ld = [p](int64_t k) {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    };
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) s.vec(k, ld(k), ld(k + 8), ld(k + 16), ld(k + 24));
    for (; k < k1; ++k) {
      const __m128i w = _mm_cvtsi32_si128(static_cast<int>(static_cast<uint32_t>(p[k]) << 16));
      s.one(k, _mm_cvtss_f32(_mm_castsi128_ps(w)));
    }
  }
};

// The 32 4-bit quants of 16 bytes as f32: byte j holds element j (low
// nibble) and element j + 16 (high nibble).  Widening the bytes to 32-bit
// lanes first lets one mask and one shift split the nibbles, with two
// byte-widening shuffles per 32 elements instead of four.
struct Nibbles {
  __m256 lo0, lo1, hi0, hi1;  // elements 0-7, 8-15, 16-23, 24-31
};
inline Nibbles nibbles16(const uint8_t* qs) {
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i b1 =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i m4 = _mm256_set1_epi32(0x0F);
  return {
      _mm256_cvtepi32_ps(_mm256_and_si256(b0, m4)), _mm256_cvtepi32_ps(_mm256_and_si256(b1, m4)),
      _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4))};
}

struct DecodeQ4_0 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ4_0* b = static_cast<const BlockQ4_0*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const Nibbles q = nibbles16(b->qs);
      // (q - 8) * d as one fma: q * d + (-8 d), with -8 d exact.
      const float d = half(b->d);
      const __m256 vd = _mm256_set1_ps(d), vo = _mm256_set1_ps(-8.0f * d);
      s.vec(k, _mm256_fmadd_ps(q.lo0, vd, vo), _mm256_fmadd_ps(q.lo1, vd, vo),
            _mm256_fmadd_ps(q.hi0, vd, vo), _mm256_fmadd_ps(q.hi1, vd, vo));
    }
  }
};

struct DecodeQ4_1 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const Nibbles q = nibbles16(b->qs);
      const __m256 vd = _mm256_set1_ps(half(b->d)), vm = _mm256_set1_ps(half(b->m));
      s.vec(k, _mm256_fmadd_ps(q.lo0, vd, vm), _mm256_fmadd_ps(q.lo1, vd, vm),
            _mm256_fmadd_ps(q.hi0, vd, vm), _mm256_fmadd_ps(q.hi1, vd, vm));
    }
  }
};

// 32 quant bytes (unsigned, or signed) as four vectors of 8 floats, in
// element order.
struct Floats32 {
  __m256 v[4];
};
inline Floats32 u8_to_ps(__m256i q) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  auto cvt = [](__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); };
  return {{cvt(lo), cvt(_mm_srli_si128(lo, 8)), cvt(hi), cvt(_mm_srli_si128(hi, 8))}};
}
inline Floats32 i8_to_ps(__m256i q) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  return {{i8_to_ps(lo), i8_to_ps(_mm_srli_si128(lo, 8)), i8_to_ps(hi),
           i8_to_ps(_mm_srli_si128(hi, 8))}};
}

// Q5_0 and Q5_1: the 5-bit quants (simd_avx2.h) times d, plus -16 d (Q5_0,
// exact, so q * d - 16 d is (q - 16) * d rounded once) or m (Q5_1).
template <class Block>
struct DecodeQ5 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const Block* b = static_cast<const Block*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const Floats32 q = u8_to_ps(q5_quants32(b->qs, b->qh));
      const float d = half(b->d);
      __m256 vo = _mm256_set1_ps(-16.0f * d);
      if constexpr (std::is_same_v<Block, BlockQ5_1>) vo = _mm256_set1_ps(half(b->m));
      const __m256 vd = _mm256_set1_ps(d);
      s.vec(k, _mm256_fmadd_ps(q.v[0], vd, vo), _mm256_fmadd_ps(q.v[1], vd, vo),
            _mm256_fmadd_ps(q.v[2], vd, vo), _mm256_fmadd_ps(q.v[3], vd, vo));
    }
  }
};

// Q2_K and Q3_K: per run of 16, (d * sc) * q - dmin * m (Q2_K) or
// (d * (sc - 32)) * q (Q3_K, q signed).
template <class Block>
struct DecodeQ23_K {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
    const Block* b = static_cast<const Block*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d);
      for (int j = 0; j < 8; ++j) {
        __m256 scale[2], offset[2];
        for (int h = 0; h < 2; ++h) {
          if constexpr (kQ3) {
            scale[h] = _mm256_set1_ps(d * static_cast<float>(q3k_scale(b->scales, 2 * j + h) - 32));
            offset[h] = _mm256_setzero_ps();
          } else {
            const uint8_t sc = b->scales[2 * j + h];
            scale[h] = _mm256_set1_ps(d * static_cast<float>(sc & 0x0F));
            offset[h] = _mm256_set1_ps(half(b->dmin) * static_cast<float>(sc >> 4));
          }
        }
        Floats32 q;
        if constexpr (kQ3) {
          q = i8_to_ps(q23_k_quants32(b->qs, b->hmask, j));
        } else {
          q = u8_to_ps(q23_k_quants32(b->qs, nullptr, j));
        }
        s.vec(k + 32 * j, _mm256_fmsub_ps(q.v[0], scale[0], offset[0]),
              _mm256_fmsub_ps(q.v[1], scale[0], offset[0]),
              _mm256_fmsub_ps(q.v[2], scale[1], offset[1]),
              _mm256_fmsub_ps(q.v[3], scale[1], offset[1]));
      }
    }
  }
};

struct DecodeQ8_0 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const __m256 vd = _mm256_set1_ps(half(b->d));
      auto ld = [b](int j) {
        return i8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + j)));
      };
      s.vec(k, _mm256_mul_ps(ld(0), vd), _mm256_mul_ps(ld(8), vd), _mm256_mul_ps(ld(16), vd),
            _mm256_mul_ps(ld(24), vd));
    }
  }
};

// Q4_K and Q5_K: per sub-block of 32, (d * sc) * q - dmin * m.
template <class Block>
struct DecodeQ45_K {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const Block* b = static_cast<const Block*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d), dmin = half(b->dmin);
      const uint8_t* qh = nullptr;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) qh = b->qh;
      for (int j = 0; j < 8; ++j) {
        const Floats32 q = u8_to_ps(q45_k_quants32(b->qs, qh, j));
        uint8_t sc, m;
        q4k_scale_min(b->scales, j, &sc, &m);
        const __m256 vd = _mm256_set1_ps(d * sc), vm = _mm256_set1_ps(dmin * m);
        s.vec(k + 32 * j, _mm256_fmsub_ps(q.v[0], vd, vm), _mm256_fmsub_ps(q.v[1], vd, vm),
              _mm256_fmsub_ps(q.v[2], vd, vm), _mm256_fmsub_ps(q.v[3], vd, vm));
      }
    }
  }
};

// IQ4_NL and IQ4_XS: each nibble picks one of the 16 int8 levels (a byte
// shuffle does 16 at once) times its run's scale, d for IQ4_NL and
// d * (ls - 32), rounded first as in the reference, per 32 elements of
// IQ4_XS.
template <class Sink>
void iq4_run(const uint8_t* qs, float scale, int64_t k, Sink& s) {
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Levels));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_shuffle_epi8(levels, _mm_and_si128(bytes, m4));
  const __m128i hi = _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16(bytes, 4), m4));
  const __m256 vd = _mm256_set1_ps(scale);
  s.vec(k, _mm256_mul_ps(i8_to_ps(lo), vd), _mm256_mul_ps(i8_to_ps(_mm_srli_si128(lo, 8)), vd),
        _mm256_mul_ps(i8_to_ps(hi), vd), _mm256_mul_ps(i8_to_ps(_mm_srli_si128(hi, 8)), vd));
}

struct DecodeIQ4_NL {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockIQ4_NL* b = static_cast<const BlockIQ4_NL*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) iq4_run(b->qs, half(b->d), k, s);
  }
};

struct DecodeIQ4_XS {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d);
      for (int r = 0; r < kQKK / kQK; ++r)
        iq4_run(b->qs + 16 * r, d * static_cast<float>(iq4xs_scale(*b, r) - 32), k + kQK * r, s);
    }
  }
};

struct DecodeQ6_K {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d);
      for (int half_i = 0; half_i < 2; ++half_i) {
        const uint8_t* ql = b->ql + 64 * half_i;
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * half_i));
        __m256i runs[4];
        unpack_q6_k_runs(l0, l1, qh, runs);
        const int8_t* sc = b->scales + 8 * half_i;
        for (int r = 0; r < 4; ++r) {
          const __m256i q = _mm256_sub_epi8(runs[r], _mm256_set1_epi8(32));  // now signed
          const __m128i qa = _mm256_castsi256_si128(q), qb = _mm256_extracti128_si256(q, 1);
          // Elements 0-15 of the run use scale 2r, 16-31 scale 2r + 1; the
          // product d * sc is rounded first, as in the reference.
          const __m256 da = _mm256_set1_ps(d * static_cast<float>(sc[2 * r]));
          const __m256 db = _mm256_set1_ps(d * static_cast<float>(sc[2 * r + 1]));
          s.vec(k + 128 * half_i + 32 * r, _mm256_mul_ps(i8_to_ps(qa), da),
                _mm256_mul_ps(i8_to_ps(_mm_srli_si128(qa, 8)), da), _mm256_mul_ps(i8_to_ps(qb), db),
                _mm256_mul_ps(i8_to_ps(_mm_srli_si128(qb, 8)), db));
        }
      }
    }
  }
};

// GEMV sink: accumulates w . x into four independent accumulators (hides the
// FMA latency).
struct DotSink {
  const float* x;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  float tail = 0.0f;

  void vec(int64_t k, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), acc[0]);
    acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), acc[1]);
    acc[2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + k + 16), acc[2]);
    acc[3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + k + 24), acc[3]);
  }
  void one(int64_t k, float w) { tail += w * x[k]; }
  float total() const {
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) + tail;
  }
};

// Row sink for packing: stores decoded weights of elements [k0, ..) at
// dst[k - k0].
struct StoreSink {
  float* dst;
  int64_t k0;
  void vec(int64_t k, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    float* p = dst + (k - k0);
    _mm256_storeu_ps(p, w0);
    _mm256_storeu_ps(p + 8, w1);
    _mm256_storeu_ps(p + 16, w2);
    _mm256_storeu_ps(p + 24, w3);
  }
  void one(int64_t k, float w) { dst[k - k0] = w; }
};

// ---- GEMM (n_rows > 1): gemm_panels.h's loop ----------------------------------
//
// The weight rows are decoded into the panels by the type's decoder
// (StoreSink); the micro-kernel keeps its 6 x 16 block of y in 12 ymm
// registers (per k: the panel's two vectors, one broadcast and 2 FMAs per
// row).

using tiles::kMR;
using tiles::kNR;

// Stores (first) or adds a row of 16 sums to y[0..ncols).
inline void store_row(float* y, __m256 a0, __m256 a1, int64_t ncols, bool first) {
  if (ncols == kNR) {
    if (!first) {
      a0 = _mm256_add_ps(_mm256_loadu_ps(y), a0);
      a1 = _mm256_add_ps(_mm256_loadu_ps(y + 8), a1);
    }
    _mm256_storeu_ps(y, a0);
    _mm256_storeu_ps(y + 8, a1);
    return;
  }
  alignas(32) float sum[kNR];
  _mm256_store_ps(sum, a0);
  _mm256_store_ps(sum + 8, a1);
  for (int64_t c = 0; c < ncols; ++c) y[c] = first ? sum[c] : y[c] + sum[c];
}

// y[r][0..ncols) (+)= sum_k x[r][k] * panel[k][0..ncols) for r < MR.  The
// loops over r are unrolled completely so the 2 * MR accumulators live in
// registers.
template <int MR>
void micro_kernel(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y,
                  int64_t ldy, int64_t ncols, bool first) {
  __m256 acc0[MR], acc1[MR];
  const float* xr[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
    xr[r] = x + r * ldx;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * kNR);
    const __m256 w1 = _mm256_load_ps(panel + k * kNR + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(xr[r] + k);
      acc0[r] = _mm256_fmadd_ps(w0, xb, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(w1, xb, acc1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) store_row(y + r * ldy, acc0[r], acc1[r], ncols, first);
}

using MicroKernel = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                             bool);
constexpr MicroKernel kMicroKernels[kMR + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>,
                                                micro_kernel<3>, micro_kernel<4>, micro_kernel<5>,
                                                micro_kernel<6>};

// What tiles::gemm needs of AVX2 (gemm_panels.h).
struct Isa {
  static constexpr int64_t kLanes = 8;
  static void transpose(const float* src, int64_t lds, float* dst, int64_t ldd) {
    transpose8(src, lds, dst, ldd);
  }
  static void micro_kernel(int mr, const float* x, int64_t ldx, const float* panel, int64_t kc,
                           float* y, int64_t ldy, int64_t ncols, bool first) {
    kMicroKernels[mr](x, ldx, panel, kc, y, ldy, ncols, first);
  }
};

template <class Decoder>
void gemv(const WeightView& w, const float* x, float* y, int64_t o_begin, int64_t o_end,
          size_t row_bytes) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = o_begin; o < o_end; ++o) {
    DotSink sink{x};
    Decoder::decode(base + static_cast<size_t>(o) * row_bytes, 0, w.n_in, sink);
    y[o] = sink.total();
  }
}

template <class Decoder>
void gemm(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
          int64_t o_end, size_t row_bytes) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  tiles::gemm<Isa>(w, x, n_rows, y, o_begin, o_end,
                   [&](int64_t o, int64_t k0, int64_t kc, float* row) {
                     StoreSink sink{row, k0};
                     Decoder::decode(base + static_cast<size_t>(o) * row_bytes, k0, k0 + kc, sink);
                   });
}

// ---- GEMV for the 32-element block types (Q4_0, Q4_1, Q8_0) ------------------
//
// Decode multiplies one activation row by every weight row, so the weight
// decode dominates.  Instead of dequantizing each weight (q * d + m) before
// the dot product, the scale and offset are factored out of each block:
//   Q8_0:  d * sum(q * x)
//   Q4_0:  d * sum(q * x) - 8 * d * sum(x)
//   Q4_1:  d * sum(q * x) + m * sum(x)
// with the block sums of x computed once per call.  The small integers q
// convert to f32 exactly, so this stays a pure f32 computation (same error
// class as the reference: f32 rounding of the sums, ~1e-7 relative) while
// saving the per-element dequantization FMAs.  This f32 GEMV serves prefill's
// single-row matmuls (the last token's logits), which are held to the
// float64 reference: int16 activations per block of 32 were measured to move
// SmolLM2's logits by up to 8e-4 relative L2 against it (its activations
// have outliers that coarsen every block they sit in), too close to the
// 1e-3 bar.  Decode, which has no such bar, takes the int8 GEMV instead
// (gemv_q8_avx2.cpp, Backend::matmul_q8), as llama.cpp does.

// Per-thread block sums of the activation row (grown on demand; malloc, see
// the linkage rule in ops_avx2.h).
struct BlockSums {
  float* sum = nullptr;
  int64_t cap = 0;
  ~BlockSums() { std::free(sum); }
  float* get(int64_t n) {
    if (n > cap) {
      std::free(sum);
      sum = static_cast<float*>(std::malloc(static_cast<size_t>(n) * sizeof(float)));
      cap = sum == nullptr ? 0 : n;
      if (sum == nullptr) throw std::bad_alloc();
    }
    return sum;
  }
};

float* block_sums(const float* x, int64_t n_blocks) {
  thread_local BlockSums sums;
  float* s = sums.get(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * kQK;
    s[b] = hsum(_mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                              _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24))));
  }
  return s;
}

// sum(q * x) of one block as 8 lanes, q given as four vectors of 8.
inline __m256 block_qx(__m256 q0, __m256 q1, __m256 q2, __m256 q3, const float* x) {
  __m256 t = _mm256_mul_ps(q0, _mm256_loadu_ps(x));
  t = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x + 8), t);
  t = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x + 16), t);
  return _mm256_fmadd_ps(q3, _mm256_loadu_ps(x + 24), t);
}

// Per-type block terms: term() is d * sum(q * x) as 8 lanes, offset() the
// block's scalar part (multiplied by its factor in gemv_blocks).
struct FactQ8_0 {
  using Block = BlockQ8_0;
  static constexpr float kOffsetFactor = 0.0f;
  static __m256 term(const Block& b, const float* x) {
    auto ld = [&b](int j) {
      return i8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + j)));
    };
    return _mm256_mul_ps(block_qx(ld(0), ld(8), ld(16), ld(24), x), _mm256_set1_ps(half(b.d)));
  }
  static float offset(const Block&, float, float acc) { return acc; }
};

struct FactQ4_0 {
  using Block = BlockQ4_0;
  static constexpr float kOffsetFactor = -8.0f;
  static __m256 term(const Block& b, const float* x) {
    const Nibbles q = nibbles16(b.qs);
    return _mm256_mul_ps(block_qx(q.lo0, q.lo1, q.hi0, q.hi1, x), _mm256_set1_ps(half(b.d)));
  }
  static float offset(const Block& b, float sx, float acc) {
    return __builtin_fmaf(half(b.d), sx, acc);
  }
};

struct FactQ4_1 {
  using Block = BlockQ4_1;
  static constexpr float kOffsetFactor = 1.0f;
  static __m256 term(const Block& b, const float* x) {
    const Nibbles q = nibbles16(b.qs);
    return _mm256_mul_ps(block_qx(q.lo0, q.lo1, q.hi0, q.hi1, x), _mm256_set1_ps(half(b.d)));
  }
  static float offset(const Block& b, float sx, float acc) {
    return __builtin_fmaf(half(b.m), sx, acc);
  }
};

// Rows [o_begin, o_end): two blocks per step into two accumulators, so
// consecutive blocks do not wait on each other's adds.
template <class K>
void gemv_blocks(const WeightView& w, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  using Block = typename K::Block;
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.n_in / kQK;
  const float* sx = block_sums(x, nb);
  for (int64_t o = o_begin; o < o_end; ++o) {
    const Block* b = reinterpret_cast<const Block*>(base + static_cast<size_t>(o) * row_bytes);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float off0 = 0.0f, off1 = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
      acc0 = _mm256_add_ps(acc0, K::term(b[i], x + i * kQK));
      acc1 = _mm256_add_ps(acc1, K::term(b[i + 1], x + (i + 1) * kQK));
      off0 = K::offset(b[i], sx[i], off0);
      off1 = K::offset(b[i + 1], sx[i + 1], off1);
    }
    if (i < nb) {
      acc0 = _mm256_add_ps(acc0, K::term(b[i], x + i * kQK));
      off0 = K::offset(b[i], sx[i], off0);
    }
    y[o] = hsum(_mm256_add_ps(acc0, acc1)) + K::kOffsetFactor * (off0 + off1);
  }
}

template <class Decoder>
void matmul_typed(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
                  int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  if (n_rows == 1) {
    switch (w.type) {
      case DType::Q4_0:
        return gemv_blocks<FactQ4_0>(w, x, y, o_begin, o_end);
      case DType::Q4_1:
        return gemv_blocks<FactQ4_1>(w, x, y, o_begin, o_end);
      case DType::Q8_0:
        return gemv_blocks<FactQ8_0>(w, x, y, o_begin, o_end);
      default:
        break;
    }
    gemv<Decoder>(w, x, y, o_begin, o_end, row_bytes);
  } else {
    gemm<Decoder>(w, x, n_rows, y, o_begin, o_end, row_bytes);
  }
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end) {
  if (n_rows <= 0 || o_begin >= o_end) return;
  switch (w.type) {
    case DType::F32:
      return matmul_typed<DecodeF32>(w, x, n_rows, y, o_begin, o_end);
    case DType::F16:
      return matmul_typed<DecodeF16>(w, x, n_rows, y, o_begin, o_end);
    case DType::BF16:
      return matmul_typed<DecodeBF16>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_0:
      return matmul_typed<DecodeQ4_0>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_1:
      return matmul_typed<DecodeQ4_1>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q5_0:
      return matmul_typed<DecodeQ5<BlockQ5_0>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q5_1:
      return matmul_typed<DecodeQ5<BlockQ5_1>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q8_0:
      return matmul_typed<DecodeQ8_0>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_K:
      return matmul_typed<DecodeQ45_K<BlockQ4_K>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q5_K:
      return matmul_typed<DecodeQ45_K<BlockQ5_K>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q2_K:
      return matmul_typed<DecodeQ23_K<BlockQ2_K>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q3_K:
      return matmul_typed<DecodeQ23_K<BlockQ3_K>>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q6_K:
      return matmul_typed<DecodeQ6_K>(w, x, n_rows, y, o_begin, o_end);
    case DType::IQ4_NL:
      return matmul_typed<DecodeIQ4_NL>(w, x, n_rows, y, o_begin, o_end);
    case DType::IQ4_XS:
      return matmul_typed<DecodeIQ4_XS>(w, x, n_rows, y, o_begin, o_end);
  }
}

}  // namespace cb::avx2
