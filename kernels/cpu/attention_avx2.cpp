// AVX2 attention, tiled: a tile is a block of query rows times the query
// heads of one KV head (GQA: the heads of a group read the same K/V, so a
// tile of 10 queries x 3 heads has 30 rows sharing every K/V load).  Keys go
// by blocks of kKeyBlock with an online softmax per row:
//  1. the block's keys are transposed into kt[d][j] (head_dim x 32), by the
//     tile, or once per KV head for all its tiles (transpose_key_blocks),
//  2. scores S = Q K^T for six rows at a time: per d, 2 loads of kt and
//     6 broadcasts feed 12 FMAs into 12 registers holding 6 x 16 scores,
//  3. per row: the causal mask (key j visible iff j <= q_pos, and j >
//     q_pos - window with a sliding window), the block
//     maximum, the rescale of what was accumulated (only when the maximum
//     grows), and the exponentials 8 at a time,
//  4. O += P V for six rows at a time: per key, 2 loads of the V row and 6
//     broadcasts feed 12 FMAs on 6 x 16 output dims held in registers.
// So each K/V block is read from memory once per tile instead of once per
// (query, head), and K/V are read in place (no per-head copies).  The loop
// over tiles and key blocks is attention_tiles.h's, shared with NEON; this
// file has the AVX2 steps 2-4 and the transposes.
//
// A row's result depends only on its own query, the keys and the key-block
// boundaries (multiples of kKeyBlock from 0), not on which tile holds it or
// on its partner row: every lane runs the same chain of FMAs in the same
// order in the 6-row and the shorter row groups.  (Keys past a row's
// position but inside the tile's range get a weight of exactly 0; K/V rows
// below n_kv are therefore expected to be finite, as every written cache row
// is.)
//
// K/V are f32 or f16 (AttentionArgs::kv_type): the kernels are templates on
// the element type, and an f16 element is widened exactly where it is
// loaded (the key transpose; a key block's V rows, once per block into
// scratch rather than once per six-row group), so the arithmetic after the
// load is the f32 path's, op for op.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

constexpr int64_t kKeyBlock = kAttentionKeyBlock;

// Scores of MR rows against the transposed key block:
// s[r * kKeyBlock + j] = sum_d q[r][d] * kt[d][j], one half of 16 keys at a
// time so the 2 x MR accumulators stay in registers (per d: 2 loads of kt,
// MR broadcasts, 2 * MR FMAs).
template <int MR>
void scores_rows(const float* const* q, const float* kt, int64_t hd, float* s) {
  for (int64_t half = 0; half < kKeyBlock; half += 16) {
    __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; ++d) {
      const __m256 k0 = _mm256_load_ps(kt + d * kKeyBlock + half);
      const __m256 k1 = _mm256_load_ps(kt + d * kKeyBlock + half + 8);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 x = _mm256_broadcast_ss(q[r] + d);
        acc0[r] = _mm256_fmadd_ps(x, k0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(x, k1, acc1[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      _mm256_store_ps(s + r * kKeyBlock + half, acc0[r]);
      _mm256_store_ps(s + r * kKeyBlock + half + 8, acc1[r]);
    }
  }
}

// o[r] = o[r] * carry[r] + sum_{j < nj} p[r][j] * v_j for MR rows of hd
// dims (row stride hd), v_j = v + j * ld; p rows are kKeyBlock apart.  Per
// key: 2 loads of the V row, MR broadcasts, 2 * MR FMAs on 16 dims at a
// time.  Each output lane is the same chain (scale, then one FMA per key
// in order) whatever MR is; a row whose weights end before nj gets FMAs
// with exactly 0, which leave it unchanged.
template <int MR>
void pv_rows(float* o, int64_t hd, const float* carry, const float* p, int64_t nj, const float* v,
             int64_t ld) {
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) {
    __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 c = _mm256_set1_ps(carry[r]);
      acc0[r] = _mm256_mul_ps(_mm256_loadu_ps(o + r * hd + d), c);
      acc1[r] = _mm256_mul_ps(_mm256_loadu_ps(o + r * hd + d + 8), c);
    }
    for (int64_t j = 0; j < nj; ++j) {
      const __m256 v0 = load8(v + j * ld + d);
      const __m256 v1 = load8(v + j * ld + d + 8);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 x = _mm256_broadcast_ss(p + r * kKeyBlock + j);
        acc0[r] = _mm256_fmadd_ps(x, v0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(x, v1, acc1[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      _mm256_storeu_ps(o + r * hd + d, acc0[r]);
      _mm256_storeu_ps(o + r * hd + d + 8, acc1[r]);
    }
  }
  for (; d + 8 <= hd; d += 8) {
    for (int r = 0; r < MR; ++r) {
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + r * hd + d), _mm256_set1_ps(carry[r]));
      for (int64_t j = 0; j < nj; ++j) {
        acc =
            _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * kKeyBlock + j), load8(v + j * ld + d), acc);
      }
      _mm256_storeu_ps(o + r * hd + d, acc);
    }
  }
  for (; d < hd; ++d) {
    for (int r = 0; r < MR; ++r) {
      float acc = o[r * hd + d] * carry[r];
      for (int64_t j = 0; j < nj; ++j)
        acc = __builtin_fmaf(p[r * kKeyBlock + j], to_f32(v[j * ld + d]), acc);
      o[r * hd + d] = acc;
    }
  }
}

constexpr int kRowGroup = 6;
using ScoresFn = void (*)(const float* const*, const float*, int64_t, float*);
using PvFn = void (*)(float*, int64_t, const float*, const float*, int64_t, const float*, int64_t);
constexpr ScoresFn kScores[kRowGroup + 1] = {nullptr,        scores_rows<1>, scores_rows<2>,
                                             scores_rows<3>, scores_rows<4>, scores_rows<5>,
                                             scores_rows<6>};
constexpr PvFn kPv[kRowGroup + 1] = {nullptr,    pv_rows<1>, pv_rows<2>, pv_rows<3>,
                                     pv_rows<4>, pv_rows<5>, pv_rows<6>};

// Turns the raw scores s[0..32) of a row whose visible keys in this block
// are [lo, hi) into softmax weights against the row's running maximum
// (updated), masked to exactly 0 outside; returns the factor that rescales what
// the row accumulated so far, and adds the weights to the row's
// denominator, kept as 8 lane sums (added up once, after the last block:
// a horizontal sum per block would put its latency on the row's chain).
// kWhole: all 32 keys are visible (masks of all ones, skipped).
template <bool kWhole>
float softmax_block(float* s, int64_t lo, int64_t hi, float scale, float* running_max,
                    __m256* denom) {
  const __m256 lane = _mm256_castsi256_ps(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 masks[4];
  __m256 vmax = neg_inf;
  for (int i = 0; i < 4; ++i) {
    __m256 x = _mm256_mul_ps(_mm256_load_ps(s + 8 * i), vscale);
    if constexpr (!kWhole) {
      const __m256i lanes = _mm256_castps_si256(lane);
      masks[i] = _mm256_castsi256_ps(_mm256_andnot_si256(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo - 8 * i)), lanes),
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi - 8 * i)), lanes)));
      x = _mm256_blendv_ps(neg_inf, x, masks[i]);
    }
    _mm256_store_ps(s + 8 * i, x);
    vmax = _mm256_max_ps(vmax, x);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float block_max = _mm_cvtss_f32(m4);
  float carry = 1.0f;
  if (block_max > *running_max) {
    carry = __builtin_expf(*running_max - block_max);  // 0 on the first block
    *running_max = block_max;
  }
  const __m256 vm = _mm256_set1_ps(*running_max);
  __m256 vsum = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + 8 * i), vm));
    if constexpr (!kWhole) e = _mm256_and_ps(e, masks[i]);
    _mm256_store_ps(s + 8 * i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  *denom = _mm256_fmadd_ps(*denom, _mm256_set1_ps(carry), vsum);
  return carry;
}

// What tiles::attention_tile needs of AVX2 (attention_tiles.h).
struct Isa {
  static constexpr int64_t kKeyBlock = avx2::kKeyBlock;
  static constexpr int kRowGroup = avx2::kRowGroup;
  static constexpr int64_t kLanes = 8;
  using Denom = __m256;
  template <class T>
  static void transpose(const T* src, int64_t lds, float* dst, int64_t ldd) {
    transpose8(src, lds, dst, ldd);
  }
  static void widen(const uint16_t* src, float* dst) { _mm256_storeu_ps(dst, load8(src)); }
  template <class T>
  static float to_f32(T x) {
    return avx2::to_f32(x);
  }
  static void scores(int mr, const float* const* q, const float* kt, int64_t hd, float* s) {
    kScores[mr](q, kt, hd, s);
  }
  static void pv(int mr, float* o, int64_t hd, const float* carry, const float* p, int64_t nj,
                 const float* v, int64_t ld) {
    kPv[mr](o, hd, carry, p, nj, v, ld);
  }
  static Denom zero_denom() { return _mm256_setzero_ps(); }
  static float denom_total(Denom d) { return hsum(d); }
  static float softmax(float* s, int64_t lo, int64_t hi, float scale, float* running_max,
                       Denom* denom) {
    if (lo == 0 && hi == kKeyBlock)
      return softmax_block<true>(s, 0, kKeyBlock, scale, running_max, denom);
    return softmax_block<false>(s, lo, hi, scale, running_max, denom);
  }
};

}  // namespace

void transpose_key_blocks(const AttentionArgs& a, int64_t g, int64_t b_begin, int64_t b_end,
                          float* key_blocks) {
  const int64_t hd = a.head_dim, ld = a.n_head_kv * hd;
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t j0 = b * kKeyBlock;
    const int64_t nb = a.n_kv - j0 < kKeyBlock ? a.n_kv - j0 : kKeyBlock;
    if (a.kv_type == DType::F16) {
      tiles::transpose_keys<Isa>(static_cast<const uint16_t*>(a.k) + j0 * ld + g * hd, ld, nb, hd,
                                 key_blocks + b * hd * kKeyBlock);
    } else {
      tiles::transpose_keys<Isa>(static_cast<const float*>(a.k) + j0 * ld + g * hd, ld, nb, hd,
                                 key_blocks + b * hd * kKeyBlock);
    }
  }
}

void attention_tile(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                    int64_t h_end) {
  attention_tile(a, nullptr, q_begin, q_end, h_begin, h_end);
}

void attention_tile(const AttentionArgs& a, const float* key_blocks, int64_t q_begin, int64_t q_end,
                    int64_t h_begin, int64_t h_end) {
  tiles::attention_tile<Isa>(a, key_blocks, q_begin, q_end, h_begin, h_end);
}

void attention_one(const AttentionArgs& a, int64_t qi, int64_t head) {
  attention_tile(a, qi, qi + 1, head, head + 1);
}

namespace {

template <class T>
void weight_sums_head(const AttentionArgs& a, int64_t head, float* sums) {
  const int64_t hd = a.head_dim, n_kv = a.n_kv;
  if (hd > tiles::kMaxHeadDim || a.n_q == 0 || n_kv == 0) {
    float* w = static_cast<float*>(std::malloc(static_cast<size_t>(n_kv) * sizeof(float)));
    if (w == nullptr) throw std::bad_alloc();
    for (int64_t qi = 0; qi < a.n_q; ++qi) {
      const int64_t n = ref::attention_weights_one(a, qi, head, w);
      for (int64_t j = 0; j < n; ++j) sums[j] += w[j];
    }
    std::free(w);
    return;
  }
  tiles::Scratch<Isa>& sc = tiles::scratch<Isa>();
  // Whole rows of scores for up to kRowsPerPass queries, padded to key
  // blocks: each key block is transposed once per pass, for all its rows.
  constexpr int64_t kRowsPerPass = 16 * kRowGroup;
  const int64_t padded = (n_kv + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  const int64_t pass_rows = a.n_q < kRowsPerPass ? a.n_q : kRowsPerPass;
  float* rows = static_cast<float*>(
      std::aligned_alloc(64, static_cast<size_t>(pass_rows * padded) * sizeof(float)));
  if (rows == nullptr) throw std::bad_alloc();
  const int64_t ld = a.n_head_kv * hd;
  const T* kbase = static_cast<const T*>(a.k) + (head / (a.n_head / a.n_head_kv)) * hd;
  const __m256 vscale = _mm256_set1_ps(a.scale);
  for (int64_t p0 = 0; p0 < a.n_q; p0 += kRowsPerPass) {
    const int64_t np = a.n_q - p0 < kRowsPerPass ? a.n_q - p0 : kRowsPerPass;
    int64_t live = 0, first = n_kv;  // keys any row of the pass sees: [first, live)
    for (int64_t r = 0; r < np; ++r) {
      const int64_t seen = attention_key_end(a, p0 + r), f = attention_first_key(a, p0 + r);
      if (seen > live) live = seen;
      if (f < first) first = f;
    }
    for (int64_t j0 = first / kKeyBlock * kKeyBlock; j0 < live; j0 += kKeyBlock) {
      const int64_t nb = n_kv - j0 < kKeyBlock ? n_kv - j0 : kKeyBlock;
      tiles::transpose_keys<Isa>(kbase + j0 * ld, ld, nb, hd, sc.kt);
      for (int64_t q0 = 0; q0 < np; q0 += kRowGroup) {
        const int mr = static_cast<int>(np - q0 < kRowGroup ? np - q0 : kRowGroup);
        const float* q[kRowGroup];
        for (int r = 0; r < mr; ++r) q[r] = a.q + (p0 + q0 + r) * a.n_head * hd + head * hd;
        kScores[mr](q, sc.kt, hd, sc.s);
        for (int r = 0; r < mr; ++r)
          std::memcpy(rows + (q0 + r) * padded + j0, sc.s + r * kKeyBlock,
                      kKeyBlock * sizeof(float));
      }
    }
    for (int64_t r = 0; r < np; ++r) {
      const int64_t nk = attention_key_end(a, p0 + r), j_first = attention_first_key(a, p0 + r);
      if (nk <= j_first) continue;
      float* s = rows + r * padded;
      if (a.key_bias.bias != 0.0f) {
        const int64_t qp = a.q_pos[p0 + r];
        for (int64_t j0 = j_first / kKeyBlock * kKeyBlock; j0 < nk; j0 += kKeyBlock)
          ref::add_key_bias(a, qp, j0, kKeyBlock, s + j0);
      }
      __m256 vmax = _mm256_set1_ps(-INFINITY);
      int64_t j = j_first;
      for (; j + 8 <= nk; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vscale);
        _mm256_storeu_ps(s + j, x);
        vmax = _mm256_max_ps(vmax, x);
      }
      float m = hmax(vmax);
      for (; j < nk; ++j) {
        s[j] *= a.scale;
        m = __builtin_fmaxf(m, s[j]);
      }
      const __m256 vm = _mm256_set1_ps(m);
      __m256 vsum = _mm256_setzero_ps();
      for (j = j_first; j + 8 <= nk; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
      }
      float l = hsum(vsum);
      for (; j < nk; ++j) {
        s[j] = __builtin_expf(s[j] - m);
        l += s[j];
      }
      const float inv = 1.0f / l;
      const __m256 vinv = _mm256_set1_ps(inv);
      for (j = j_first; j + 8 <= nk; j += 8)
        _mm256_storeu_ps(sums + j,
                         _mm256_fmadd_ps(_mm256_loadu_ps(s + j), vinv, _mm256_loadu_ps(sums + j)));
      for (; j < nk; ++j) sums[j] += s[j] * inv;
    }
  }
  std::free(rows);
}

}  // namespace

void attention_weight_sums_head(const AttentionArgs& a, int64_t head, float* sums) {
  if (a.kv_type == DType::F16) return weight_sums_head<uint16_t>(a, head, sums);
  weight_sums_head<float>(a, head, sums);
}

}  // namespace cb::avx2
