// The int8 GEMM of prefill with AVX-VNNI (VEX-encoded VPDPBUSD on 256-bit
// registers: Intel client cores from Alder Lake on, which have no
// AVX-512): its micro-kernel (the rest is gemm_q8_tiles.h).  One
// instruction takes 32 unsigned-by-signed byte products into int32 lanes,
// with no 16-bit intermediate, so every weight type is supported, as with
// AVX-512.  The int32 sums and the f32 operations after them are the other
// int8 GEMMs', so it gives their bits.  Compiled with AVX-VNNI on top of
// AVX2+FMA+F16C (kernels/CMakeLists.txt) and called only at the avx2-vnni
// level; the linkage rule of ops_avx2.h applies.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_q8_tiles.h"
#include "kernels/cpu/gemm_q8_ymm.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avxvnni {
namespace {

using avx2::Quants32;
using int8_tiles::MicroKernel;

// A group's integer sums (see gemm_q8_ymm.h): per step, the panel's 16
// columns x 4 quant bytes against 4 activation bytes broadcast.  Three
// rows keep their sums and accumulators, the weights and the broadcast in
// the 16 ymm registers.
template <int G>
struct DpbusdSums {
  static constexpr int kGroup = G;
  template <int MR>
  static void group(const uint8_t* cp, const int8_t* xq, int64_t n_in, int g,
                    __m256i (&isum)[MR][2]) {
    for (int r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int step = 0; step < G / 4; ++step) {
      const int k4 = g * (G / 4) + step;
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cp + 64 * k4));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cp + 64 * k4 + 32));
      for (int r = 0; r < MR; ++r) {
        int32_t xb;
        __builtin_memcpy(&xb, xq + r * n_in + 4 * k4, 4);
        const __m256i xv = _mm256_set1_epi32(xb);
        isum[r][0] = _mm256_dpbusd_avx_epi32(isum[r][0], w0, xv);
        isum[r][1] = _mm256_dpbusd_avx_epi32(isum[r][1], w1, xv);
      }
    }
  }
};

struct Isa {
  using Quants = Quants32;
  static constexpr int64_t kMR = 3;  // activation rows per micro-kernel call
  static constexpr int64_t kNP = 1;  // panels per micro-kernel call
  template <class Decoder>
  static constexpr bool supports = true;
  template <int MR, int NP, class Decoder>
  static constexpr MicroKernel kernel =
      int8_tiles::ymm_micro_kernel<DpbusdSums<Decoder::kGroup>, MR>;
};

}  // namespace

bool gemm_q8_supported(DType t) {
  return int8_tiles::supported<Isa>(t);
}

void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end) {
  int8_tiles::gemm_q8<Isa>(w, x, s16, n_rows, y, o_begin, o_end);
}

}  // namespace cb::avxvnni
