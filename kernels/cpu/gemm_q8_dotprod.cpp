// The int8 GEMM of prefill on AArch64 cores with the dot-product extension
// (FEAT_DotProd, optional from Armv8.2-A): its micro-kernel and its way of
// handling 32 quant bytes (the rest is gemm_q8_tiles.h).  SDOT by element
// multiplies 4 columns' 4 quant bytes by the 4 activation bytes of one step
// and adds each column's products to its int32 lane: 16 products an
// instruction, where an f32 FMA gives 4.  SDOT multiplies signed bytes, so
// it serves the types whose unsigned quants stay below 128: every type but
// Q8_0 and the IQ4 types, which keep the f32 GEMM (as at the avx2 level).
//
// Compiled with -march=armv8.2-a+dotprod (kernels/CMakeLists.txt: GCC
// declares SDOT's intrinsics for Armv8.2-A, the first version the
// extension may come with) and called only at the neon-dotprod level,
// which needs cpu_features().dotprod; the linkage rule of ops_avx2.h holds
// here too.  The int32 sums and the f32
// operations after them are the x86 kernels', so every level with an int8
// GEMM gives the same bits.
#include <arm_neon.h>

#include <cstdint>

#include "kernels/cpu/gemm_q8_tiles.h"
#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/simd_neon.h"

namespace cb::neon {
namespace {

using int8_tiles::chunk_bytes;
using int8_tiles::kNR;
using int8_tiles::MicroKernel;
using int8_tiles::Rows;

// What the decoders of the supported types and the packing use (see
// gemm_q8_tiles.h); the quant helpers are simd_neon.h's.
struct Quants32 {
  using Bytes = Bytes32;
  static Bytes nibbles(const uint8_t* qs) { return nibbles32(qs); }
  static Bytes q5_quants(const uint8_t* qs, const uint8_t* qh) { return q5_quants32(qs, qh); }
  static Bytes q23_k_quants(const uint8_t* qs, const uint8_t* hmask, int j) {
    return q23_k_quants32(qs, hmask, j);
  }
  static Bytes q45_k_quants(const uint8_t* qs, const uint8_t* qh, int j) {
    return q45_k_quants32(qs, qh, j);
  }
  static void q6_k_runs(const uint8_t* ql, const uint8_t* qh, Bytes runs[4]) {
    q6_k_runs32(ql, qh, runs);
  }
  static Bytes plus(Bytes v, int n) {
    const uint8x16_t d = vdupq_n_u8(static_cast<uint8_t>(n));
    return {vaddq_u8(v.lo, d), vaddq_u8(v.hi, d)};
  }
  static void store(uint8_t* p, Bytes v) {
    vst1q_u8(p, v.lo);
    vst1q_u8(p + 16, v.hi);
  }
  static float half(uint16_t h) { return to_f32(h); }
  // 16 rows of 8 dwords (row i at src + i * lds) into 8 rows of 16.
  static void transpose16x8(const float* src, int64_t lds, float* dst) {
    for (int c = 0; c < 16; c += 4)
      for (int k = 0; k < 8; k += 4) transpose4(src + c * lds + k, lds, dst + k * 16 + c, 16);
  }
};

// Step L of four (one lane of the rows' 16 activation bytes) for 8 columns:
// their 4 quant bytes each, as two vectors of 4 columns, at w.
template <int MR, int L>
inline void dot_step(const uint8_t* w, const int8x16_t (&xv)[MR], int32x4_t (&isum)[MR][2]) {
  const int8x16_t w0 = vreinterpretq_s8_u8(vld1q_u8(w));
  const int8x16_t w1 = vreinterpretq_s8_u8(vld1q_u8(w + 16));
  for (int r = 0; r < MR; ++r) {
    isum[r][0] = vdotq_laneq_s32(isum[r][0], w0, xv[r], L);
    isum[r][1] = vdotq_laneq_s32(isum[r][1], w1, xv[r], L);
  }
}

// Stores (first) or adds v to the n < 4 or first 4 floats at y (none for
// n <= 0).
inline void store(float32x4_t v, float* y, int64_t n, bool first) {
  if (n >= 4) {
    vst1q_f32(y, first ? v : vaddq_f32(v, vld1q_f32(y)));
  } else if (n > 0) {
    float t[4];
    vst1q_f32(t, v);
    for (int64_t i = 0; i < n; ++i) y[i] = first ? t[i] : y[i] + t[i];
  }
}

// A MicroKernel for MR rows and one panel, taken as two halves of 8
// columns one after the other (a whole panel's sums and accumulators for
// more than two rows would not fit in the 32 vector registers): per four
// steps, 16 activation bytes of each row, then per step two SDOTs a row.
template <int MR, class Decoder>
void micro_kernel(const Rows& x, const uint8_t* panel, size_t, int64_t n_chunks, float* y,
                  int64_t ldy, int64_t ncols, bool first) {
  constexpr int kG = Decoder::kGroup;
  const int64_t nb = x.n_in / kQK;
  for (int h = 0; h < 2 && 8 * h < ncols; ++h) {
    float32x4_t acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      const uint8_t* cp = panel + static_cast<size_t>(ch) * chunk_bytes(kG);
      const int8_t* xq = x.qs + ch * kQK;
      for (int g = 0; g < 32 / kG; ++g) {
        int32x4_t isum[MR][2];
        for (int r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = vdupq_n_s32(0);
        for (int k4 = g * (kG / 4); k4 < (g + 1) * (kG / 4); k4 += 4) {
          int8x16_t xv[MR];
          for (int r = 0; r < MR; ++r) xv[r] = vld1q_s8(xq + r * x.n_in + 4 * k4);
          const uint8_t* w = cp + 64 * k4 + 32 * h;
          dot_step<MR, 0>(w, xv, isum);
          dot_step<MR, 1>(w + 64, xv, isum);
          dot_step<MR, 2>(w + 128, xv, isum);
          dot_step<MR, 3>(w + 192, xv, isum);
        }
        const int64_t grp = ch * (32 / kG) + g;
        const float* sc = reinterpret_cast<const float*>(cp + 8 * 64) + 2 * kNR * g + 8 * h;
        for (int q = 0; q < 2; ++q) {
          const float32x4_t scale = vld1q_f32(sc + 4 * q), off = vld1q_f32(sc + kNR + 4 * q);
          for (int r = 0; r < MR; ++r) {
            const float32x4_t f = vmulq_n_f32(scale, x.d[r * nb + ch]);
            acc[r][q] = vfmaq_f32(acc[r][q], vcvtq_f32_s32(isum[r][q]), f);
            acc[r][q] = vfmaq_n_f32(acc[r][q], off, x.s[r * x.lds + grp]);
          }
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < 2; ++q) {
        store(acc[r][q], y + r * ldy + 8 * h + 4 * q, ncols - 8 * h - 4 * q, first);
      }
    }
  }
}

struct Isa {
  using Quants = Quants32;
  static constexpr int64_t kMR = 4;  // activation rows per micro-kernel call
  static constexpr int64_t kNP = 1;  // panels per micro-kernel call
  template <class Decoder>
  static constexpr bool supports = Decoder::kMaxQuant <= 127;
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

}  // namespace cb::neon
