// The AVX-512 VNNI micro-kernel of the int8 GEMM of prefill (the rest is
// gemm_q8_tiles.h): VPDPBUSD takes 64 unsigned-by-signed byte products per
// instruction, about 2.6x the rate of f32 FMAs on the same 512-bit
// registers.  Every weight type is supported.
// GCC 12's avx512fintrin.h starts conversions from _mm512_undefined_ps(),
// which -Wmaybe-uninitialized reports as a use of an uninitialized value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_q8_tiles.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx512 {
namespace {

using avx2::Quants32;
using int8_tiles::chunk_bytes;
using int8_tiles::kNR;
using int8_tiles::MicroKernel;
using int8_tiles::Rows;

// A MicroKernel for MR rows and NP panels: per panel and step, one zmm of
// 16 columns x 4 quant bytes against 4 activation bytes broadcast.
template <int MR, int NP, int G>
void micro_kernel(const Rows& x, const uint8_t* panels, size_t panel_bytes, int64_t n_chunks,
                  float* y, int64_t ldy, int64_t ncols, bool first) {
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t nb = x.n_in / kQK;
  for (int64_t ch = 0; ch < n_chunks; ++ch) {
    const uint8_t* cp = panels + static_cast<size_t>(ch) * chunk_bytes(G);
    const int8_t* xq = x.qs + ch * kQK;
    for (int g = 0; g < 32 / G; ++g) {
      __m512i isum[MR][NP];
      for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p) isum[r][p] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int step = 0; step < G / 4; ++step) {
        const int k4 = g * (G / 4) + step;
        __m512i w[NP];
        for (int p = 0; p < NP; ++p) w[p] = _mm512_load_si512(cp + p * panel_bytes + 64 * k4);
        for (int r = 0; r < MR; ++r) {
          int32_t xb;
          __builtin_memcpy(&xb, xq + r * x.n_in + 4 * k4, 4);
          const __m512i xv = _mm512_set1_epi32(xb);
          for (int p = 0; p < NP; ++p) isum[r][p] = _mm512_dpbusd_epi32(isum[r][p], w[p], xv);
        }
      }
      const int64_t grp = ch * (32 / G) + g;
      for (int p = 0; p < NP; ++p) {
        const float* sc =
            reinterpret_cast<const float*>(cp + p * panel_bytes + 8 * 64) + 2 * kNR * g;
        const __m512 scale = _mm512_load_ps(sc), off = _mm512_load_ps(sc + kNR);
        for (int r = 0; r < MR; ++r) {
          const __m512 f = _mm512_mul_ps(scale, _mm512_set1_ps(x.d[r * nb + ch]));
          acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][p]), f, acc[r][p]);
          acc[r][p] = _mm512_fmadd_ps(off, _mm512_set1_ps(x.s[r * x.lds + grp]), acc[r][p]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < NP; ++p) {
      const int64_t n = ncols - p * kNR;
      if (n <= 0) break;
      float* yp = y + r * ldy + p * kNR;
      const __mmask16 m =
          n >= kNR ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
      __m512 v = acc[r][p];
      if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, yp));
      _mm512_mask_storeu_ps(yp, m, v);
    }
  }
}

struct Isa {
  using Quants = Quants32;
  static constexpr int64_t kMR = 6;  // activation rows per micro-kernel call
  static constexpr int64_t kNP = 2;  // panels per micro-kernel call
  template <class Decoder>
  static constexpr bool supports = true;
  template <int MR, int NP, class Decoder>
  static constexpr MicroKernel kernel = micro_kernel<MR, NP, Decoder::kGroup>;
};

}  // namespace

bool gemm_q8_supported(DType t) {
  return int8_tiles::supported<Isa>(t);
}

void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end) {
  int8_tiles::gemm_q8<Isa>(w, x, s16, n_rows, y, o_begin, o_end);
}

}  // namespace cb::avx512
