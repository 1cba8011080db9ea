// The AVX2 micro-kernel of the int8 GEMM of prefill (the rest is
// gemm_q8_tiles.h).  VPMADDUBSW multiplies 32 unsigned weight bytes by 32
// signed activation bytes and adds adjacent pairs into 16-bit lanes, which
// saturate: so it serves only the types whose quants are small enough
// (kMaxQuant <= 63: every type but Q8_0 and the IQ4 types, which keep the
// f32 GEMM).  The 16-bit lanes of a few steps add up before VPMADDWD widens
// them to the group's int32 sums, as many steps as cannot overflow: all 8
// of a group of 32 for the 4-bit types, 4 for the 5-bit ones, 2 for Q6_K.
// The int32 sums and the f32 operations after them are the AVX-512
// kernel's, so both give the same bits.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_q8_tiles.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

using int8_tiles::chunk_bytes;
using int8_tiles::kNR;
using int8_tiles::MicroKernel;
using int8_tiles::Rows;

// A pair of products is at most 2 * kMaxQuant * 128 in magnitude (the
// activations are in [-127, 127]; 128 leaves a margin).
template <class Decoder>
constexpr int kStepsIn16Bits = 32767 / (2 * Decoder::kMaxQuant * 128);

// A MicroKernel for MR rows and one panel (two ymm of 8 columns): per step,
// the panel's 16 columns x 4 quant bytes against 4 activation bytes
// broadcast.
template <int MR, class Decoder>
void micro_kernel(const Rows& x, const uint8_t* panel, size_t, int64_t n_chunks, float* y,
                  int64_t ldy, int64_t ncols, bool first) {
  constexpr int kG = Decoder::kGroup;
  constexpr int kSteps = kG / 4;
  constexpr int kBatch = kSteps < kStepsIn16Bits<Decoder> ? kSteps : kStepsIn16Bits<Decoder>;
  static_assert(kBatch >= 1 && kSteps % kBatch == 0);
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t nb = x.n_in / kQK;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t ch = 0; ch < n_chunks; ++ch) {
    const uint8_t* cp = panel + static_cast<size_t>(ch) * chunk_bytes(kG);
    const int8_t* xq = x.qs + ch * kQK;
    for (int g = 0; g < 32 / kG; ++g) {
      __m256i isum[MR][2];
      for (int r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
      for (int b = 0; b < kSteps / kBatch; ++b) {
        __m256i s16[MR][2];
        for (int r = 0; r < MR; ++r) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int step = 0; step < kBatch; ++step) {
          const int k4 = g * kSteps + b * kBatch + step;
          const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cp + 64 * k4));
          const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cp + 64 * k4 + 32));
          for (int r = 0; r < MR; ++r) {
            int32_t xb;
            __builtin_memcpy(&xb, xq + r * x.n_in + 4 * k4, 4);
            const __m256i xv = _mm256_set1_epi32(xb);
            s16[r][0] = _mm256_add_epi16(s16[r][0], _mm256_maddubs_epi16(w0, xv));
            s16[r][1] = _mm256_add_epi16(s16[r][1], _mm256_maddubs_epi16(w1, xv));
            // Left alone, GCC re-associates the unrolled chains of adds
            // into trees that hold every product in a register (and
            // spills them); the empty asm keeps each chain in order.
            __asm__("" : "+x"(s16[r][0]), "+x"(s16[r][1]));
          }
        }
        for (int r = 0; r < MR; ++r) {
          for (int h = 0; h < 2; ++h)
            isum[r][h] = _mm256_add_epi32(isum[r][h], _mm256_madd_epi16(s16[r][h], ones));
        }
      }
      const int64_t grp = ch * (32 / kG) + g;
      const float* sc = reinterpret_cast<const float*>(cp + 8 * 64) + 2 * kNR * g;
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_load_ps(sc + 8 * h), off = _mm256_load_ps(sc + kNR + 8 * h);
        for (int r = 0; r < MR; ++r) {
          const __m256 f = _mm256_mul_ps(scale, _mm256_set1_ps(x.d[r * nb + ch]));
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), f, acc[r][h]);
          acc[r][h] = _mm256_fmadd_ps(off, _mm256_set1_ps(x.s[r * x.lds + grp]), acc[r][h]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int h = 0; h < 2; ++h) {
      const int64_t n = ncols - 8 * h;
      if (n <= 0) break;
      float* yp = y + r * ldy + 8 * h;
      if (n >= 8) {
        __m256 v = acc[r][h];
        if (!first) v = _mm256_add_ps(v, _mm256_loadu_ps(yp));
        _mm256_storeu_ps(yp, v);
      } else {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[r][h]);
        for (int64_t i = 0; i < n; ++i) yp[i] = first ? v[i] : yp[i] + v[i];
      }
    }
  }
}

struct Isa {
  using Quants = Quants32;
  static constexpr int64_t kMR = 6;  // activation rows per micro-kernel call
  static constexpr int64_t kNP = 1;  // panels per micro-kernel call
  template <class Decoder>
  static constexpr bool supports = Decoder::kMaxQuant <= 63;
  template <int MR, int NP, class Decoder>
  static constexpr MicroKernel kernel = micro_kernel<MR, Decoder>;
};

}  // namespace

bool gemm_q8_supported(DType t) {
  return int8_tiles::supported<Isa>(t);
}

bool gemm_q8_uses_half_sums(DType t) {
  return int8_tiles::uses_half_sums<Isa>(t);
}

void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end) {
  int8_tiles::gemm_q8<Isa>(w, x, s16, n_rows, y, o_begin, o_end);
}

}  // namespace cb::avx2
