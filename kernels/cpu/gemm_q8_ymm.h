// The int8 GEMM's micro-kernel on 256-bit registers (gemm_q8_tiles.h) for
// MR rows and one panel (two ymm of 8 columns), whatever makes a group's
// integer sums: Sums::kGroup is the group length and
// Sums::group<MR>(chunk, xq, n_in, g, isum) sets isum[r][h] to row r's
// int32 sums of group g for columns 8h .. 8h + 7, from the panel's chunk
// and the rows' activation bytes of that chunk (row r at xq + r * n_in).
// gemm_q8_avx2.cpp makes them with VPMADDUBSW, gemm_q8_avxvnni.cpp with
// VPDPBUSD; the f32 operations after them are here, once.  Include only
// from files compiled with AVX2+FMA (the linkage rule in ops_avx2.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_q8_tiles.h"

namespace cb::int8_tiles {
namespace {

template <class Sums, int MR>
void ymm_micro_kernel(const Rows& x, const uint8_t* panel, size_t, int64_t n_chunks, float* y,
                      int64_t ldy, int64_t ncols, bool first) {
  constexpr int kG = Sums::kGroup;
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t nb = x.n_in / kQK;
  for (int64_t ch = 0; ch < n_chunks; ++ch) {
    const uint8_t* cp = panel + static_cast<size_t>(ch) * chunk_bytes(kG);
    for (int g = 0; g < 32 / kG; ++g) {
      __m256i isum[MR][2];
      Sums::template group<MR>(cp, x.qs + ch * kQK, x.n_in, g, isum);
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

}  // namespace
}  // namespace cb::int8_tiles
