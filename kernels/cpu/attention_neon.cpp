// NEON attention, tiled exactly as the AVX2 kernel (attention_avx2.cpp) and
// through the same loop (attention_tiles.h): a tile is a block of query rows
// times the query heads of one KV head; keys go by blocks of kKeyBlock,
// transposed once per block; scores and the P V update run six rows at a
// time on 16 keys / 16 output dims with 24 accumulators of 4 lanes; an
// online softmax per row.  A row's result does not depend on the tiling.
// K/V rows below n_kv are expected to be finite (keys past a row's position
// inside a tile's range get weight exactly 0).  K/V are f32 or f16
// (AttentionArgs::kv_type); an f16 element is widened exactly where it is
// loaded (the key transpose; a key block's V rows, once per block into
// scratch), so the arithmetic is the f32 path's.
#include <cmath>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/simd_neon.h"

namespace cb::neon {
namespace {

constexpr int64_t kKeyBlock = 32;
constexpr int kRowGroup = 6;

// s[r * kKeyBlock + j] = sum_d q[r][d] * kt[d][j], 16 keys at a time.
template <int MR>
void scores_rows(const float* const* q, const float* kt, int64_t hd, float* s) {
  for (int64_t half = 0; half < kKeyBlock; half += 16) {
    float32x4_t acc[MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int i = 0; i < 4; ++i) acc[r][i] = vdupq_n_f32(0.0f);
    }
    for (int64_t d = 0; d < hd; ++d) {
      const float* kr = kt + d * kKeyBlock + half;
      const float32x4_t k0 = vld1q_f32(kr), k1 = vld1q_f32(kr + 4);
      const float32x4_t k2 = vld1q_f32(kr + 8), k3 = vld1q_f32(kr + 12);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const float32x4_t x = vld1q_dup_f32(q[r] + d);
        acc[r][0] = vfmaq_f32(acc[r][0], x, k0);
        acc[r][1] = vfmaq_f32(acc[r][1], x, k1);
        acc[r][2] = vfmaq_f32(acc[r][2], x, k2);
        acc[r][3] = vfmaq_f32(acc[r][3], x, k3);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int i = 0; i < 4; ++i) vst1q_f32(s + r * kKeyBlock + half + 4 * i, acc[r][i]);
    }
  }
}

// o[r] = o[r] * carry[r] + sum_{j < nj} p[r][j] * v_j, 16 dims at a time.
template <int MR>
void pv_rows(float* o, int64_t hd, const float* carry, const float* p, int64_t nj, const float* v,
             int64_t ld) {
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) {
    float32x4_t acc[MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int i = 0; i < 4; ++i)
        acc[r][i] = vmulq_n_f32(vld1q_f32(o + r * hd + d + 4 * i), carry[r]);
    }
    for (int64_t j = 0; j < nj; ++j) {
      const float* vr = v + j * ld + d;
      const float32x4_t v0 = load4(vr), v1 = load4(vr + 4);
      const float32x4_t v2 = load4(vr + 8), v3 = load4(vr + 12);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const float32x4_t x = vld1q_dup_f32(p + r * kKeyBlock + j);
        acc[r][0] = vfmaq_f32(acc[r][0], x, v0);
        acc[r][1] = vfmaq_f32(acc[r][1], x, v1);
        acc[r][2] = vfmaq_f32(acc[r][2], x, v2);
        acc[r][3] = vfmaq_f32(acc[r][3], x, v3);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int i = 0; i < 4; ++i) vst1q_f32(o + r * hd + d + 4 * i, acc[r][i]);
    }
  }
  for (; d + 4 <= hd; d += 4) {
    for (int r = 0; r < MR; ++r) {
      float32x4_t acc = vmulq_n_f32(vld1q_f32(o + r * hd + d), carry[r]);
      for (int64_t j = 0; j < nj; ++j) {
        acc = vfmaq_f32(acc, vld1q_dup_f32(p + r * kKeyBlock + j), load4(v + j * ld + d));
      }
      vst1q_f32(o + r * hd + d, acc);
    }
  }
  for (; d < hd; ++d) {
    for (int r = 0; r < MR; ++r) {
      float acc = o[r * hd + d] * carry[r];
      for (int64_t j = 0; j < nj; ++j)
        acc = std::fma(p[r * kKeyBlock + j], to_f32(v[j * ld + d]), acc);
      o[r * hd + d] = acc;
    }
  }
}

using ScoresFn = void (*)(const float* const*, const float*, int64_t, float*);
using PvFn = void (*)(float*, int64_t, const float*, const float*, int64_t, const float*, int64_t);
constexpr ScoresFn kScores[kRowGroup + 1] = {nullptr,        scores_rows<1>, scores_rows<2>,
                                             scores_rows<3>, scores_rows<4>, scores_rows<5>,
                                             scores_rows<6>};
constexpr PvFn kPv[kRowGroup + 1] = {nullptr,    pv_rows<1>, pv_rows<2>, pv_rows<3>,
                                     pv_rows<4>, pv_rows<5>, pv_rows<6>};

// Softmax weights of one row's block of scores (see avx2 softmax_block).
float softmax_block(float* s, int64_t lo, int64_t hi, float scale, float* running_max,
                    float* denom) {
  const int32x4_t lane = {0, 1, 2, 3};
  const float32x4_t neg_inf = vdupq_n_f32(-INFINITY);
  uint32x4_t masks[8];
  float32x4_t vmax = neg_inf;
  for (int i = 0; i < 8; ++i) {
    masks[i] = vandq_u32(vcltq_s32(lane, vdupq_n_s32(static_cast<int32_t>(hi - 4 * i))),
                         vcgeq_s32(lane, vdupq_n_s32(static_cast<int32_t>(lo - 4 * i))));
    const float32x4_t x = vbslq_f32(masks[i], vmulq_n_f32(vld1q_f32(s + 4 * i), scale), neg_inf);
    vst1q_f32(s + 4 * i, x);
    vmax = vmaxq_f32(vmax, x);
  }
  const float block_max = vmaxvq_f32(vmax);
  float carry = 1.0f;
  if (block_max > *running_max) {
    carry = std::exp(*running_max - block_max);  // 0 on the first block
    *running_max = block_max;
  }
  const float32x4_t vm = vdupq_n_f32(*running_max);
  float32x4_t vsum = vdupq_n_f32(0.0f);
  for (int i = 0; i < 8; ++i) {
    const float32x4_t e = vreinterpretq_f32_u32(
        vandq_u32(vreinterpretq_u32_f32(exp4(vsubq_f32(vld1q_f32(s + 4 * i), vm))), masks[i]));
    vst1q_f32(s + 4 * i, e);
    vsum = vaddq_f32(vsum, e);
  }
  *denom = *denom * carry + vaddvq_f32(vsum);
  return carry;
}

// What tiles::attention_tile needs of NEON (attention_tiles.h).
struct Isa {
  static constexpr int64_t kKeyBlock = neon::kKeyBlock;
  static constexpr int kRowGroup = neon::kRowGroup;
  static constexpr int64_t kLanes = 4;
  using Denom = float;
  template <class T>
  static void transpose(const T* src, int64_t lds, float* dst, int64_t ldd) {
    transpose4(src, lds, dst, ldd);
  }
  static void widen(const uint16_t* src, float* dst) { vst1q_f32(dst, load4(src)); }
  template <class T>
  static float to_f32(T x) {
    return neon::to_f32(x);
  }
  static void scores(int mr, const float* const* q, const float* kt, int64_t hd, float* s) {
    kScores[mr](q, kt, hd, s);
  }
  static void pv(int mr, float* o, int64_t hd, const float* carry, const float* p, int64_t nj,
                 const float* v, int64_t ld) {
    kPv[mr](o, hd, carry, p, nj, v, ld);
  }
  static Denom zero_denom() { return 0.0f; }
  static float denom_total(Denom d) { return d; }
  static float softmax(float* s, int64_t lo, int64_t hi, float scale, float* running_max,
                       Denom* denom) {
    return softmax_block(s, lo, hi, scale, running_max, denom);
  }
};

}  // namespace

void attention_tile(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                    int64_t h_end) {
  tiles::attention_tile<Isa>(a, nullptr, q_begin, q_end, h_begin, h_end);
}

}  // namespace cb::neon
