// NEON attention, tiled exactly as the AVX2 kernel (attention_avx2.cpp): a
// tile is a block of query rows times the query heads of one KV head; keys
// go by blocks of kKeyBlock, transposed once per block; scores and the
// P V update run six rows at a time on 16 keys / 16 output dims with 24
// accumulators of 4 lanes; an online softmax per row.  A row's result does
// not depend on the tiling.  K/V rows below n_kv are expected to be finite
// (keys past a row's position inside a tile's range get weight exactly 0).
// K/V are f32 or f16 (AttentionArgs::kv_type); an f16 element is widened
// exactly where it is loaded (the key transpose; a key block's V rows, once
// per block into scratch), so the arithmetic is the f32 path's.
#include <cmath>
#include <cstdlib>
#include <new>

#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/simd_neon.h"

namespace cb::neon {
namespace {

constexpr int64_t kKeyBlock = 32;
constexpr int64_t kMaxRows = 64;
constexpr int64_t kMaxHeadDim = 256;
constexpr int kRowGroup = 6;

struct Scratch {
  float* kt = alloc(kMaxHeadDim * kKeyBlock);
  float* s = alloc(kMaxRows * kKeyBlock);
  float* o = alloc(kMaxRows * kMaxHeadDim);
  float* v = alloc(kKeyBlock * kMaxHeadDim);  // an f16 block's V rows widened
  static float* alloc(int64_t n) {
    void* p = std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<float*>(p);
  }
  ~Scratch() {
    std::free(kt);
    std::free(s);
    std::free(o);
    std::free(v);
  }
};

// The V rows [0, nb) of a key block as pv_rows reads them, with their row
// stride in *ld: f32 rows in place; f16 rows widened into buf (hd apart).
const float* v_rows(const float* vb, int64_t, int64_t, float*, int64_t*) {
  return vb;
}
const float* v_rows(const uint16_t* vb, int64_t nb, int64_t hd, float* buf, int64_t* ld) {
  for (int64_t j = 0; j < nb; ++j) {
    const uint16_t* src = vb + j * *ld;
    float* dst = buf + j * hd;
    int64_t d = 0;
    for (; d + 4 <= hd; d += 4) vst1q_f32(dst + d, load4(src + d));
    for (; d < hd; ++d) dst[d] = to_f32(src[d]);
  }
  *ld = hd;
  return buf;
}

Scratch& scratch() {
  thread_local Scratch buffers;
  return buffers;
}

// kt[d * kKeyBlock + j] = k[j * ld + d] for j < nb, d < hd; columns nb..31 zero.
template <class T>
void transpose_keys(const T* k, int64_t ld, int64_t nb, int64_t hd, float* kt) {
  if (nb < kKeyBlock) {
    for (int64_t d = 0; d < hd; ++d) {
      for (int64_t j = nb; j < kKeyBlock; ++j) kt[d * kKeyBlock + j] = 0.0f;
    }
  }
  int64_t j = 0;
  for (; j + 4 <= nb; j += 4) {
    int64_t d = 0;
    for (; d + 4 <= hd; d += 4) transpose4(k + j * ld + d, ld, kt + d * kKeyBlock + j, kKeyBlock);
    for (; d < hd; ++d) {
      for (int64_t i = 0; i < 4; ++i) kt[d * kKeyBlock + j + i] = to_f32(k[(j + i) * ld + d]);
    }
  }
  for (; j < nb; ++j) {
    for (int64_t d = 0; d < hd; ++d) kt[d * kKeyBlock + j] = to_f32(k[j * ld + d]);
  }
}

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

template <class T>
void attention_rows(const AttentionArgs& a, int64_t q_begin, int64_t nq, int64_t h_begin,
                    int64_t nh, Scratch& sc) {
  const int64_t hd = a.head_dim;
  const int64_t q_stride = a.n_head * hd;
  const int64_t kv_stride = a.n_head_kv * hd;
  const int64_t kv_head = h_begin / (a.n_head / a.n_head_kv);
  const T* kbase = static_cast<const T*>(a.k) + kv_head * hd;
  const T* vbase = static_cast<const T*>(a.v) + kv_head * hd;
  const int64_t n_rows = nq * nh;

  const float* qrow[kMaxRows];
  int64_t first_key[kMaxRows], n_keys[kMaxRows], lo[kMaxRows], hi[kMaxRows];
  float running_max[kMaxRows], denom[kMaxRows], carry[kMaxRows];
  int64_t keys_needed = 0, first_needed = a.n_kv;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t qi = q_begin + r / nh, h = h_begin + r % nh;
    qrow[r] = a.q + qi * q_stride + h * hd;
    n_keys[r] = attention_key_end(a, qi);
    first_key[r] = attention_first_key(a, qi);
    keys_needed = n_keys[r] > keys_needed ? n_keys[r] : keys_needed;
    first_needed = first_key[r] < first_needed ? first_key[r] : first_needed;
    running_max[r] = -INFINITY;
    denom[r] = 0.0f;
    for (int64_t d = 0; d < hd; ++d) sc.o[r * hd + d] = 0.0f;
  }

  for (int64_t j0 = first_needed / kKeyBlock * kKeyBlock; j0 < keys_needed; j0 += kKeyBlock) {
    const int64_t nb = keys_needed - j0 < kKeyBlock ? keys_needed - j0 : kKeyBlock;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t l = first_key[r] - j0, h = n_keys[r] - j0;
      lo[r] = l < 0 ? 0 : (l < nb ? l : nb);
      hi[r] = h < lo[r] ? lo[r] : (h < nb ? h : nb);
    }
    transpose_keys(kbase + j0 * kv_stride, kv_stride, nb, hd, sc.kt);
    int64_t v_ld = kv_stride;
    const float* vb = v_rows(vbase + j0 * kv_stride, nb, hd, sc.v, &v_ld);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kRowGroup) {
      const int64_t mr = n_rows - r0 < kRowGroup ? n_rows - r0 : kRowGroup;
      int64_t nj = 0;
      for (int64_t r = r0; r < r0 + mr; ++r) nj = hi[r] > lo[r] && hi[r] > nj ? hi[r] : nj;
      if (nj == 0) continue;
      float* s = sc.s + r0 * kKeyBlock;
      kScores[mr](qrow + r0, sc.kt, hd, s);
      for (int64_t r = r0; r < r0 + mr; ++r) {
        float* sr = sc.s + r * kKeyBlock;
        if (a.key_bias.bias != 0.0f)
          ref::add_key_bias(a, a.q_pos[q_begin + r / nh], j0, kKeyBlock, sr);
        if (hi[r] > lo[r]) {
          carry[r] = softmax_block(sr, lo[r], hi[r], a.scale, &running_max[r], &denom[r]);
        } else {  // no visible key in this block: leave the row unchanged
          carry[r] = 1.0f;
          for (int64_t j = 0; j < kKeyBlock; ++j) sr[j] = 0.0f;
        }
      }
      kPv[mr](sc.o + r0 * hd, hd, carry + r0, s, nj, vb, v_ld);
    }
  }

  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t qi = q_begin + r / nh, h = h_begin + r % nh;
    float* out = a.out + qi * q_stride + h * hd;
    const float inv = denom[r] > 0.0f ? 1.0f / denom[r] : 0.0f;  // no visible key -> zeros
    for (int64_t d = 0; d < hd; ++d) out[d] = sc.o[r * hd + d] * inv;
  }
}

}  // namespace

void attention_tile(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                    int64_t h_end) {
  const int64_t nh = h_end - h_begin;
  if (q_begin >= q_end || nh <= 0) return;
  if (a.head_dim > kMaxHeadDim || nh > kMaxRows) {
    for (int64_t qi = q_begin; qi < q_end; ++qi) {
      for (int64_t h = h_begin; h < h_end; ++h) ref::attention_one(a, qi, h);
    }
    return;
  }
  Scratch& sc = scratch();
  const int64_t q_step = kMaxRows / nh;
  for (int64_t q0 = q_begin; q0 < q_end; q0 += q_step) {
    const int64_t nq = q_end - q0 < q_step ? q_end - q0 : q_step;
    if (a.kv_type == DType::F16) {
      attention_rows<uint16_t>(a, q0, nq, h_begin, nh, sc);
    } else {
      attention_rows<float>(a, q0, nq, h_begin, nh, sc);
    }
  }
}

}  // namespace cb::neon
