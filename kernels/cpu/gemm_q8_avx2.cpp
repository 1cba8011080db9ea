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
#include "kernels/cpu/gemm_q8_ymm.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

using int8_tiles::MicroKernel;

// A pair of products is at most 2 * kMaxQuant * 128 in magnitude (the
// activations are in [-127, 127]; 128 leaves a margin).
template <class Decoder>
constexpr int kStepsIn16Bits = 32767 / (2 * Decoder::kMaxQuant * 128);

// A group's integer sums (see gemm_q8_ymm.h): per step, the panel's 16
// columns x 4 quant bytes against 4 activation bytes broadcast.
template <class Decoder>
struct PairSums {
  static constexpr int kGroup = Decoder::kGroup;
  template <int MR>
  static void group(const uint8_t* cp, const int8_t* xq, int64_t n_in, int g,
                    __m256i (&isum)[MR][2]) {
    constexpr int kSteps = kGroup / 4;
    constexpr int kBatch = kSteps < kStepsIn16Bits<Decoder> ? kSteps : kStepsIn16Bits<Decoder>;
    static_assert(kBatch >= 1 && kSteps % kBatch == 0);
    const __m256i ones = _mm256_set1_epi16(1);
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
          __builtin_memcpy(&xb, xq + r * n_in + 4 * k4, 4);
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
  }
};

struct Isa {
  using Quants = Quants32;
  static constexpr int64_t kMR = 6;  // activation rows per micro-kernel call
  static constexpr int64_t kNP = 1;  // panels per micro-kernel call
  template <class Decoder>
  static constexpr bool supports = Decoder::kMaxQuant <= 63;
  template <int MR, int NP, class Decoder>
  static constexpr MicroKernel kernel = int8_tiles::ymm_micro_kernel<PairSums<Decoder>, MR>;
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
