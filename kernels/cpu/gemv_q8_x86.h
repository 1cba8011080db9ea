// The int8 GEMV of decode for one x86 kernel level, compiled once per level:
// gemv_q8_avx2.cpp includes it with CB_GEMV_LEVEL avx2 (AVX2+FMA+F16C),
// gemv_q8_avx512.cpp with avx512 (AVX-512 F, BW, VL and VNNI as well),
// each defining cb::<level>::quantize_q8a and cb::<level>::gemv_q8 (see
// ops_avx2.h, ops_avx512.h).  The levels differ in a block's integer dot
// product (VPMADDUBSW + VPMADDWD, or one VPDPBUSD), the fifth bit of
// Q5_0 / Q5_1 quants (a byte compare, or a masked add), and Q4_K and Q6_K
// rows, which the avx512 level takes in 512-bit steps.
//
// Weights stay in their GGUF blocks, the activation row is quantized to
// int8 blocks of 32 (Q8Row), and each block's dot product is taken in
// integers: unsigned weight bytes times signed activation bytes, summed in
// int32 (through int16 pairs at the avx2 level, or with the per-16 scales
// of Q2_K, Q3_K and Q6_K applied by VPMADDWD).  Per 32 weights that is a
// handful of instructions, against the f32 path's widening of every weight
// to f32 and four FMAs; on 2 cores the f32 GEMV was bound by those
// instructions (kernel_bench: ~5 GB/s of Q4_1 weights, cache-resident or
// not), the int8 one is several times faster per CPU-second, and with it
// the memory stalls show (see the prefetches).  Signed weights (Q8_0, Q6_K,
// Q3_K, IQ4) go through the usual sign trick, |w| * (x * sign(w)).  No
// int16 sum can saturate: |w| <= 128 and |x| <= 127 give at most
// 2 * 128 * 127 = 32512 per pair.
//
// Same results as ref::gemv_q8 up to f32 summation order: the integer sums
// are exact, and the per-block scale products are formed as there, except
// that the avx512 level's Q6_K applies its per-16 scales in f32,
// ((d * dx) * sc) * sum, where the reference sums sc * sum in integers.
#ifndef CB_GEMV_LEVEL
#error "define CB_GEMV_LEVEL (avx2 or avx512) before including gemv_q8_x86.h"
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::CB_GEMV_LEVEL {
namespace {

using avx2::half;
using avx2::hsum;
using avx2::iq4_levels32;
using avx2::load32;
using avx2::nibbles32;
using avx2::q23_k_quants32;
using avx2::q45_k_quants32;
using avx2::q5_quants32;
using avx2::unpack_q6_k_runs;

// Eight int32 partial sums of w[i] * x[i] over 32 bytes, w unsigned.
inline __m256i dot_u8s8(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

// The same with w signed.
inline __m256i dot_s8s8(__m256i w, __m256i x) {
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// acc += isum * scale, lane-wise.
inline __m256 fma_block(__m256i isum, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

// The 32-element block types: one weight block per activation block.  Each
// type gives the block's integer dot product with the activation bytes and
// how its offset enters: kOffset (Q4_1, Q5_1) adds m * s per block; a
// nonzero kScaleOffset c (Q4_0, Q5_0) takes the quants unsigned, so the
// block's value is d * (q + c), and adds c * d * s per block, which saves
// the sign juggling of a signed dot product.
struct DotQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kOffset = false;
  static constexpr float kScaleOffset = 0.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_s8s8(load32(b.qs), x); }
};
struct DotQ4_0 {
  using Block = BlockQ4_0;
  static constexpr bool kOffset = false;
  static constexpr float kScaleOffset = -8.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(nibbles32(b.qs), x); }
};
struct DotQ4_1 {
  using Block = BlockQ4_1;
  static constexpr bool kOffset = true;
  static constexpr float kScaleOffset = 0.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(nibbles32(b.qs), x); }
};
static_assert(offsetof(BlockQ4_1, m) == offsetof(BlockQ4_1, d) + 2);
struct DotQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kOffset = false;
  static constexpr float kScaleOffset = -16.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(q5_quants32(b.qs, b.qh), x); }
};
struct DotQ5_1 {
  using Block = BlockQ5_1;
  static constexpr bool kOffset = true;
  static constexpr float kScaleOffset = 0.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_u8s8(q5_quants32(b.qs, b.qh), x); }
};
static_assert(offsetof(BlockQ5_1, m) == offsetof(BlockQ5_1, d) + 2);

struct DotIQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr bool kOffset = false;
  static constexpr float kScaleOffset = 0.0f;
  static __m256i dot(const Block& b, __m256i x) { return dot_s8s8(iq4_levels32(b.qs), x); }
};

// R output rows at once: each activation block is loaded once for all R
// rows, and the R accumulator chains are independent, so the FMA latency is
// hidden without splitting a row's sum.  Every row gets the same chain of
// operations whatever R is (one accumulator, blocks in order), so the
// result does not depend on how rows are grouped or split over threads.
template <class T, int R>
void rows_blocks(const uint8_t* base, size_t row_bytes, const Q8Row& x, int64_t nb, float* y,
                 const uint8_t* pf = nullptr) {
  static_assert(R == 1 || R == 4);
  using Block = typename T::Block;
  const Block* w[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const Block*>(base + static_cast<size_t>(r) * row_bytes);
    acc[r] = _mm256_setzero_ps();
  }
  // The R rows' scale products of a block are formed in one vector and
  // broadcast from memory, and their offsets accumulate in one vector
  // (no scalar chain per row).
  alignas(32) float f[8];
  __m256 off = _mm256_setzero_ps();  // kOffset: m * s in the odd lanes
  __m128 off_d = _mm_setzero_ps();   // kScaleOffset: d * s of row r in lane r
  // pf (when set): the R rows to prefetch, a block of each per step, at
  // least one per cache line (kEvery blocks fit in a line).
  static_assert(sizeof(Block) <= 64);
  constexpr int64_t kEvery = 64 / sizeof(Block);
  for (int64_t b = 0; b < nb; ++b) {
    if (pf != nullptr && b % kEvery == 0)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(pf) + r * row_bytes + b * sizeof(Block),
                     _MM_HINT_T1);
    const __m256i xv = load32(x.qs + kQK * b);
    if constexpr (T::kOffset) {
      // d and m are adjacent: the R (d, m) pairs convert at once, and one
      // multiply by (dx, s, dx, s, ..) gives d * dx (even lanes, the
      // scales) and m * s (odd lanes, the offsets).
      int dm_bits[4] = {0, 0, 0, 0};
      for (int r = 0; r < R; ++r) __builtin_memcpy(&dm_bits[r], &w[r][b].d, 4);
      const __m128i dm = _mm_setr_epi32(dm_bits[0], dm_bits[1], dm_bits[2], dm_bits[3]);
      const __m256 p = _mm256_mul_ps(
          _mm256_cvtph_ps(dm), _mm256_unpacklo_ps(_mm256_set1_ps(x.d[b]), _mm256_set1_ps(x.s[b])));
      _mm256_store_ps(f, p);
      off = _mm256_add_ps(off, p);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T::dot(w[r][b], xv)),
                                 _mm256_broadcast_ss(f + 2 * r), acc[r]);
    } else {
      uint16_t d_bits[4] = {0, 0, 0, 0};
      for (int r = 0; r < R; ++r) d_bits[r] = w[r][b].d;
      const __m128i dh = _mm_setr_epi16(
          static_cast<int16_t>(d_bits[0]), static_cast<int16_t>(d_bits[1]),
          static_cast<int16_t>(d_bits[2]), static_cast<int16_t>(d_bits[3]), 0, 0, 0, 0);
      const __m128 d = _mm_cvtph_ps(dh);
      _mm_store_ps(f, _mm_mul_ps(d, _mm_set1_ps(x.d[b])));
      if constexpr (T::kScaleOffset != 0.0f) off_d = _mm_fmadd_ps(d, _mm_set1_ps(x.s[b]), off_d);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T::dot(w[r][b], xv)),
                                 _mm256_broadcast_ss(f + r), acc[r]);
    }
  }
  _mm256_store_ps(f, off);
  alignas(16) float fd[4];
  _mm_store_ps(fd, off_d);
  for (int r = 0; r < R; ++r) {
    float o = 0.0f;
    if constexpr (T::kOffset) o = f[2 * r + 1];
    if constexpr (T::kScaleOffset != 0.0f) o = T::kScaleOffset * fd[r];
    y[r] = hsum(acc[r]) + o;
  }
}

// The weights stream from memory once per token, far beyond the caches;
// prefetching a row group kAhead groups ahead measured ~15 % faster than
// the hardware prefetcher alone on a DRAM-sized matrix (kernel_bench, one
// thread).  Into L2 rather than L1: on the real 0.5B and 1.5B models'
// decode that measured 1-4 % faster, and never slower on SmolLM2 beyond
// the noise.  gemv_blocks spreads those prefetches through the group's
// work (rows_blocks' pf) instead of issuing the group's bytes in one
// burst: on an AMD Zen 4 VM a 4,864-wide Q5_0 matrix from DRAM went from
// 15-16 to 23-28 GB/s (2 threads) and the 0.5B's decode from about 50 to
// 59 tok/s.  The super-block rows below (`rows`) do the same, a
// super-block of the row kPrefetchBytes or more ahead per step: at the avx2
// level on that VM, 2 threads from DRAM, Q4_K went from 18.5-19.8 to
// 22-23.5 GB/s and Q6_K from 17.4-18.4 to 23.6-24.4; Q5_K, which both
// levels run this way, from 19 to 24-28 at the avx512 level.
inline void prefetch_bytes(const uint8_t* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p) + off, _MM_HINT_T1);
}

template <class T>
void gemv_blocks(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  constexpr int kRows = 4;
  constexpr int64_t kAhead = 2;
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.n_in / kQK;
  int64_t o = o_begin;
  for (; o + kRows <= o_end; o += kRows) {
    const uint8_t* pf = o + (kAhead + 1) * kRows <= o_end
                            ? base + static_cast<size_t>(o + kAhead * kRows) * row_bytes
                            : nullptr;
    rows_blocks<T, kRows>(base + static_cast<size_t>(o) * row_bytes, row_bytes, x, nb, y + o, pf);
  }
  for (; o < o_end; ++o)
    rows_blocks<T, 1>(base + static_cast<size_t>(o) * row_bytes, row_bytes, x, nb, y + o);
}

// ---- K-quants and IQ4_XS: super-blocks of 256 ----
//
// Each super-block meets 8 activation blocks; their scales are one vector
// load, so the 8 products weight scale x activation scale are formed at
// once, and each sub-block's integer sum is then scaled by a broadcast from
// memory (no scalar arithmetic per sub-block).

// 8 bytes as 8 floats.
inline __m256 u8x8_to_ps(uint64_t v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(v))));
}

// The int16 pair sums of a 32-element run whose two halves of 16 have
// their own scales (Q2_K, Q3_K, Q6_K): VPMADDWD applies them while it widens
// (int16 lanes 0-7 hold elements 0-15, lanes 8-15 elements 16-31).
// `scales` holds the 8 int16 scales of four runs in both 128-bit lanes; run
// r (0..3) takes words 2r (low lane) and 2r + 1 (high lane) by a byte
// shuffle.
inline __m256i scale_halves(__m256i p16, __m256i scales, int r) {
  const __m256i pick =
      _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((4 * r + 3) << 8 | (4 * r + 2))),
                       _mm_set1_epi16(static_cast<int16_t>((4 * r + 1) << 8 | (4 * r))));
  return _mm256_madd_epi16(p16, _mm256_shuffle_epi8(scales, pick));
}

// 8 int16 scales (from 8 bytes, signed) in both 128-bit lanes.
inline __m256i scales8_i16(const int8_t* sc) {
  const __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
  return _mm256_set_m128i(v, v);
}

// Q4_K and Q5_K: a scale and a min per sub-block of 32.
template <class Block>
float row_q45_k(const Block* w, const uint8_t* pf, const Q8Row& x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  alignas(32) float f[8];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(*w) * sb, sizeof(*w));
    uint64_t sc, m;
    q4k_scales_mins(w[sb].scales, &sc, &m);
    // (d * sc) * dx and (dmin * m) * s, as the reference forms them.
    const __m256 dx = _mm256_loadu_ps(x.d + 8 * sb);
    _mm256_store_ps(
        f, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(half(w[sb].d)), u8x8_to_ps(sc)), dx));
    acc_min = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(half(w[sb].dmin)), u8x8_to_ps(m)),
                              _mm256_loadu_ps(x.s + 8 * sb), acc_min);
    const uint8_t* qh = nullptr;
    if constexpr (std::is_same_v<Block, BlockQ5_K>) qh = w[sb].qh;
    const int8_t* xq = x.qs + kQKK * sb;
    for (int j = 0; j < 8; j += 2) {
      acc0 = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(dot_u8s8(q45_k_quants32(w[sb].qs, qh, j), load32(xq + kQK * j))),
          _mm256_broadcast_ss(f + j), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q45_k_quants32(w[sb].qs, qh, j + 1),
                                                         load32(xq + kQK * (j + 1)))),
                             _mm256_broadcast_ss(f + j + 1), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - hsum(acc_min);
}

// Q6_K: a signed 8-bit scale per run of 16, quants q - 32.  (Unused where
// row_q6_k_512x2 below takes its place.)
[[maybe_unused]] float row_q6_k(const BlockQ6_K* w, const uint8_t* pf, const Q8Row& x,
                                int64_t n_super) {
  const __m256i off = _mm256_set1_epi8(32);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  alignas(32) float f[8];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(*w) * sb, sizeof(*w));
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_set1_ps(half(w[sb].d)), _mm256_loadu_ps(x.d + 8 * sb)));
    const int8_t* xq = x.qs + kQKK * sb;
    for (int h = 0; h < 2; ++h) {
      __m256i runs[4];
      unpack_q6_k_runs(load32(w[sb].ql + 64 * h), load32(w[sb].ql + 64 * h + 32),
                       load32(w[sb].qh + 32 * h), runs);
      const __m256i scales = scales8_i16(w[sb].scales + 8 * h);
      for (int r = 0; r < 4; ++r) {
        const __m256i q = _mm256_sub_epi8(runs[r], off);
        const __m256i p16 = _mm256_maddubs_epi16(
            _mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(xq + kQK * (4 * h + r)), q));
        const __m256 t = _mm256_cvtepi32_ps(scale_halves(p16, scales, r));
        if (r % 2 == 0) {
          acc0 = _mm256_fmadd_ps(t, _mm256_broadcast_ss(f + 4 * h + r), acc0);
        } else {
          acc1 = _mm256_fmadd_ps(t, _mm256_broadcast_ss(f + 4 * h + r), acc1);
        }
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Q4_K and Q6_K in 512-bit steps of 64 weights, two sub-blocks per step:
// about half the instructions per weight of the 256-bit rows above, which
// counts where arithmetic rather than DRAM sets the pace (rows in cache,
// or more read bandwidth per core).  kernel_bench, one thread: 12 -> 14.5
// GB/s on an 8,960 x 1,536 Q4_K matrix, 18 -> 23 GB/s on a 1,536 x 1,536
// Q6_K one; from DRAM on 2 threads, 5-7 % more.  Each step's two
// sub-blocks sit in the lower and upper 256 bits; a permute puts each
// one's scale under its 8 int32 sums.
//
// Rows go two at a time (row_pairs), and each super-block step prefetches
// the same super-block of the pair of rows kPrefetchBytes or more ahead:
// the prefetches spread evenly through the work instead of a burst of a
// whole row per row.  On a 2-core AMD Zen 4 VM, one thread, from DRAM, an
// 8,960-wide Q4_K matrix went from 13.5-15.7 to 17-20 GB/s; the bursts of
// two rows at once were slower than one row at a time (10.5 against 14).

// Lanes 0-7 take element a of a vector, lanes 8-15 element b.
inline __m512i pick_halves(int a, int b) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

// Q4_K: 64 bytes of quants hold sub-blocks 4h and 4h + 2 in their low
// nibbles, 4h + 1 and 4h + 3 in their high ones; the activation blocks are
// paired to match by one 128-bit shuffle each.
// Q4_K's 8 scales and 8 mins as 16 bytes (sc 0-7, then m 0-7), from its
// 12 bytes of scales taken as words a, b, c (see q4k_scales_mins).
inline __m128i q4k_scales_mins16(const uint8_t* scales) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));  // a b c (qs)
  const __m128i low = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
      _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// Two rows at a time: each step's activation bytes and their shuffles
// serve both rows.  A row's arithmetic does not depend on the other row,
// so it gives the same bits in any pair (row_pairs runs an odd row left
// at the end paired with itself).  pf and pf + pf_stride: the rows to
// prefetch, one super-block per step.
void row_q4_k_512x2(const BlockQ4_K* w0, const BlockQ4_K* w1, const uint8_t* pf, size_t pf_stride,
                    const Q8Row& x, int64_t n_super, float* y) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i pick[4] = {pick_halves(0, 2), pick_halves(1, 3), pick_halves(4, 6),
                           pick_halves(5, 7)};
  const __m512i d_dmin = pick_halves(0, 1);
  const BlockQ4_K* w[2] = {w0, w1};
  __m512 acc0[2], acc1[2], acc_min[2];
  for (int r = 0; r < 2; ++r) acc0[r] = acc1[r] = acc_min[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(BlockQ4_K) * sb, sizeof(BlockQ4_K));
    prefetch_bytes(pf + pf_stride + sizeof(BlockQ4_K) * sb, sizeof(BlockQ4_K));
    // Lanes 0-7: (d * sc) * dx, the sub-blocks' scales; lanes 8-15:
    // (dmin * m) * s, their offsets; each formed as the reference forms it.
    const __m512 dxs = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_zextps256_ps512(_mm256_loadu_ps(x.d + 8 * sb))),
                           _mm256_castps_pd(_mm256_loadu_ps(x.s + 8 * sb)), 1));
    __m512 f[2];
    for (int r = 0; r < 2; ++r) {
      const BlockQ4_K& b = w[r][sb];
      const __m512 dm = _mm512_permutexvar_ps(
          d_dmin, _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(
                      static_cast<int>(b.d | static_cast<uint32_t>(b.dmin) << 16)))));
      f[r] = _mm512_mul_ps(
          _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_mins16(b.scales)))),
          dxs);
      acc_min[r] = _mm512_mask_add_ps(acc_min[r], 0xFF00, acc_min[r], f[r]);
    }
    const int8_t* xq = x.qs + kQKK * sb;
    for (int h = 0; h < 2; ++h) {
      const __m512i xa = _mm512_loadu_si512(xq + 128 * h);       // sub-blocks 4h, 4h + 1
      const __m512i xb = _mm512_loadu_si512(xq + 128 * h + 64);  // 4h + 2, 4h + 3
      const __m512i x_lo = _mm512_shuffle_i64x2(xa, xb, 0x44);
      const __m512i x_hi = _mm512_shuffle_i64x2(xa, xb, 0xEE);
      for (int r = 0; r < 2; ++r) {
        const __m512i q = _mm512_loadu_si512(w[r][sb].qs + 64 * h);
        const __m512i lo =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(q, m4), x_lo);
        const __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                               _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), x_hi);
        acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_permutexvar_ps(pick[2 * h], f[r]),
                                  acc0[r]);
        acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi),
                                  _mm512_permutexvar_ps(pick[2 * h + 1], f[r]), acc1[r]);
      }
    }
  }
  for (int r = 0; r < 2; ++r)
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) - _mm512_reduce_add_ps(acc_min[r]);
}

// Q6_K: 64 bytes of ql and the 32 bytes of qh that go with them make runs
// 4h, 4h + 1 (low nibbles) and 4h + 2, 4h + 3 (high nibbles), each pair
// against 64 consecutive activation bytes.  The upper half's qh is taken
// shifted by 2, so both halves find their two high bits at the same place.
// The quants stay unsigned: VPDPBUSD sums q * x per 4 elements, and
// 32 * x's sum comes off by a second one.  Int32 lane i of step s then
// belongs to run of 16 number 4s + i / 4, and takes that run's scale
// (d * dx) * sc, formed once per super-block.
struct alignas(64) Q6KLanes {
  int32_t run[4][16];  // step s: lane i takes run 4s + i / 4
  int32_t block[16];   // run r is in activation block r / 2
  constexpr Q6KLanes() : run{}, block{} {
    for (int i = 0; i < 16; ++i) {
      for (int s = 0; s < 4; ++s) run[s][i] = 4 * s + i / 4;
      block[i] = i / 2;
    }
  }
};
inline constexpr Q6KLanes kQ6KLanes;

// Two rows at a time, as row_q4_k_512x2: the activation bytes and the
// 32 * x sums serve both rows.
void row_q6_k_512x2(const BlockQ6_K* w0, const BlockQ6_K* w1, const uint8_t* pf, size_t pf_stride,
                    const Q8Row& x, int64_t n_super, float* y) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), u32 = _mm512_set1_epi8(32);
  const __m512i to_block = _mm512_load_si512(kQ6KLanes.block);
  const BlockQ6_K* w[2] = {w0, w1};
  __m512 acc0[2], acc1[2];
  for (int r = 0; r < 2; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(BlockQ6_K) * sb, sizeof(BlockQ6_K));
    prefetch_bytes(pf + pf_stride + sizeof(BlockQ6_K) * sb, sizeof(BlockQ6_K));
    const __m256 xd = _mm256_loadu_ps(x.d + 8 * sb);
    __m512 g[2];
    for (int r = 0; r < 2; ++r) {
      const __m512 dx = _mm512_permutexvar_ps(
          to_block, _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(half(w[r][sb].d)), xd)));
      g[r] = _mm512_mul_ps(dx, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                   reinterpret_cast<const __m128i*>(w[r][sb].scales)))));
    }
    const int8_t* xq = x.qs + kQKK * sb;
    for (int h = 0; h < 2; ++h) {
      __m512i runs[2][2];
      for (int r = 0; r < 2; ++r) {
        const __m512i l = _mm512_loadu_si512(w[r][sb].ql + 64 * h);
        const __m256i qh =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][sb].qh + 32 * h));
        const __m512i hb =
            _mm512_inserti64x4(_mm512_zextsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        runs[r][0] =
            _mm512_or_si512(_mm512_and_si512(l, m4),
                            _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(0x03)), 4));
        runs[r][1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                     _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
      }
      for (int k = 0; k < 2; ++k) {
        const __m512i xv = _mm512_loadu_si512(xq + 128 * h + 64 * k);
        const __m512i x32 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u32, xv);
        const __m512i lanes = _mm512_load_si512(kQ6KLanes.run[2 * h + k]);
        for (int r = 0; r < 2; ++r) {
          const __m512i isum =
              _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), runs[r][k], xv), x32);
          const __m512 scale = _mm512_permutexvar_ps(lanes, g[r]);
          if (k == 0) {
            acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc0[r]);
          } else {
            acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc1[r]);
          }
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

#endif

// Q3_K: a 6-bit scale centred on 32 per run of 16; signed quants.
float row_q3_k(const BlockQ3_K* w, const uint8_t* pf, const Q8Row& x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  alignas(32) float f[8];
  alignas(16) int8_t sc[16];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(*w) * sb, sizeof(*w));
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_set1_ps(half(w[sb].d)), _mm256_loadu_ps(x.d + 8 * sb)));
    for (int r = 0; r < 16; ++r) sc[r] = static_cast<int8_t>(q3k_scale(w[sb].scales, r) - 32);
    const int8_t* xq = x.qs + kQKK * sb;
    for (int j = 0; j < 8; ++j) {
      const __m256i q = q23_k_quants32(w[sb].qs, w[sb].hmask, j);
      const __m256i p16 =
          _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(xq + kQK * j), q));
      const __m256 t = _mm256_cvtepi32_ps(scale_halves(p16, scales8_i16(sc + 8 * (j / 4)), j % 4));
      if (j % 2 == 0) {
        acc0 = _mm256_fmadd_ps(t, _mm256_broadcast_ss(f + j), acc0);
      } else {
        acc1 = _mm256_fmadd_ps(t, _mm256_broadcast_ss(f + j), acc1);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// Q2_K: per run of 16, a 4-bit scale and a 4-bit min.
float row_q2_k(const BlockQ2_K* w, const uint8_t* pf, const Q8Row& x, int64_t n_super) {
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  alignas(32) float f[8], fm[8];
  alignas(16) int8_t sc[16];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(*w) * sb, sizeof(*w));
    const __m256 dx = _mm256_loadu_ps(x.d + 8 * sb);
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_set1_ps(half(w[sb].d)), dx));
    _mm256_store_ps(fm, _mm256_mul_ps(_mm256_set1_ps(half(w[sb].dmin)), dx));
    for (int r = 0; r < 16; ++r) sc[r] = static_cast<int8_t>(w[sb].scales[r] & 0x0F);
    const int8_t* xq = x.qs + kQKK * sb;
    for (int j = 0; j < 8; ++j) {
      const __m256i xv = load32(xq + kQK * j);
      const uint8_t ma = w[sb].scales[2 * j] >> 4, mb = w[sb].scales[2 * j + 1] >> 4;
      const __m256i isum =
          scale_halves(_mm256_maddubs_epi16(q23_k_quants32(w[sb].qs, nullptr, j), xv),
                       scales8_i16(sc + 8 * (j / 4)), j % 4);
      const __m256i mins = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(mb)),
                                            _mm_set1_epi8(static_cast<char>(ma)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(f + j), acc);
      acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(mins, xv)), _mm256_broadcast_ss(fm + j),
                                acc_min);
    }
  }
  return hsum(acc) - hsum(acc_min);
}

// IQ4_XS: 8 sub-blocks of IQ4_NL levels, a 6-bit scale (minus 32) each.
float row_iq4_xs(const BlockIQ4_XS* w, const uint8_t* pf, const Q8Row& x, int64_t n_super) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  alignas(32) float f[8];
  alignas(32) int32_t ls[8];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_bytes(pf + sizeof(*w) * sb, sizeof(*w));
    for (int j = 0; j < 8; ++j) ls[j] = iq4xs_scale(w[sb], j) - 32;
    // (d * (ls - 32)) * dx, as the reference forms it.
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(half(w[sb].d)),
                                                   _mm256_cvtepi32_ps(_mm256_load_si256(
                                                       reinterpret_cast<const __m256i*>(ls)))),
                                     _mm256_loadu_ps(x.d + 8 * sb)));
    const int8_t* xq = x.qs + kQKK * sb;
    for (int j = 0; j < 8; j += 2) {
      acc0 = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(dot_s8s8(iq4_levels32(w[sb].qs + 16 * j), load32(xq + kQK * j))),
          _mm256_broadcast_ss(f + j), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(iq4_levels32(w[sb].qs + 16 * j + 16),
                                                         load32(xq + kQK * (j + 1)))),
                             _mm256_broadcast_ss(f + j + 1), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

constexpr size_t kPrefetchBytes = 4096;

template <class Block, float (*Row)(const Block*, const uint8_t*, const Q8Row&, int64_t)>
void rows(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_super = w.n_in / kQKK;
  const int64_t ahead = static_cast<int64_t>(kPrefetchBytes / row_bytes) + 1;
  for (int64_t o = o_begin; o < o_end; ++o) {
    // The row itself near the end, where there is nothing ahead.
    const int64_t p = o + ahead < o_end ? o + ahead : o;
    y[o] = Row(reinterpret_cast<const Block*>(base + static_cast<size_t>(o) * row_bytes),
               base + static_cast<size_t>(p) * row_bytes, x, n_super);
  }
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Two rows at a time through Row2, which prefetches as it goes from the
// rows `ahead` on (the pair itself near the end, where there is nothing
// ahead); an odd row left at the end is paired with itself.
template <class Block, void (*Row2)(const Block*, const Block*, const uint8_t*, size_t,
                                    const Q8Row&, int64_t, float*)>
void row_pairs(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_super = w.n_in / kQKK;
  const int64_t ahead = 2 * (static_cast<int64_t>(kPrefetchBytes / (2 * row_bytes)) + 1);
  const auto row = [&](int64_t o) {
    return reinterpret_cast<const Block*>(base + static_cast<size_t>(o) * row_bytes);
  };
  int64_t o = o_begin;
  for (; o + 2 <= o_end; o += 2) {
    const int64_t p = o + ahead + 1 < o_end ? o + ahead : o;
    Row2(row(o), row(o + 1), base + static_cast<size_t>(p) * row_bytes, row_bytes, x, n_super,
         y + o);
  }
  if (o < o_end) {
    float pair[2];
    Row2(row(o), row(o), base + static_cast<size_t>(o) * row_bytes, 0, x, n_super, pair);
    y[o] = pair[0];
  }
}
#endif
}  // namespace

void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s) {
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
    d[b] = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
    const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1));
    // Saturating packs interleave the 128-bit lanes; the permute restores
    // element order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), p8);
    s[b] = d[b] * static_cast<float>(_mm_cvtsi128_si32(sum));
  }
}

void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
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
    case DType::IQ4_NL:
      return gemv_blocks<DotIQ4_NL>(w, x, y, o_begin, o_end);
    case DType::Q2_K:
      return rows<BlockQ2_K, row_q2_k>(w, x, y, o_begin, o_end);
    case DType::Q3_K:
      return rows<BlockQ3_K, row_q3_k>(w, x, y, o_begin, o_end);
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
    case DType::Q4_K:
      return row_pairs<BlockQ4_K, row_q4_k_512x2>(w, x, y, o_begin, o_end);
    case DType::Q6_K:
      return row_pairs<BlockQ6_K, row_q6_k_512x2>(w, x, y, o_begin, o_end);
#else
    case DType::Q4_K:
      return rows<BlockQ4_K, row_q45_k<BlockQ4_K>>(w, x, y, o_begin, o_end);
    case DType::Q6_K:
      return rows<BlockQ6_K, row_q6_k>(w, x, y, o_begin, o_end);
#endif
    case DType::Q5_K:
      return rows<BlockQ5_K, row_q45_k<BlockQ5_K>>(w, x, y, o_begin, o_end);
    case DType::IQ4_XS:
      return rows<BlockIQ4_XS, row_iq4_xs>(w, x, y, o_begin, o_end);
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      break;  // no int8 kernel (ref::gemv_q8_supported); the backend never calls this
  }
}

}  // namespace cb::CB_GEMV_LEVEL
