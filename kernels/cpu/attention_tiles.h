// The tiled attention loop that the AVX2 and NEON kernels share
// (attention_avx2.cpp describes the tiling).  What differs by instruction
// set comes in a traits type `Isa`, defined by each kernel file in an
// anonymous namespace, so that every instantiation here has internal
// linkage and is compiled with that file's flags (the linkage rule in
// ops_avx2.h):
//   kKeyBlock, kRowGroup       keys per block (32), rows per register group (6)
//   kLanes                     floats per vector
//   transpose(src, lds, dst, ldd)   a kLanes x kLanes block of f32 or f16
//                              elements, transposed into floats
//   widen(src, dst)            kLanes f32 or f16 elements as floats
//   to_f32(x)                  one element as a float
//   scores(mr, q, kt, hd, s)   s[r][j] = q[r] . kt[.][j] for mr <= kRowGroup rows
//   pv(mr, o, hd, carry, p, nj, v, ld)   o[r] = o[r] * carry[r] + sum_j p[r][j] v_j
//   Denom, zero_denom(), denom_total(d)  a row's softmax denominator
//   softmax(s, lo, hi, scale, &running_max, &denom)  a block's scores to
//                              weights (see avx2 softmax_block); the carry
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "kernels/backend.h"
#include "kernels/cpu/reference_ops.h"

namespace cb::tiles {

constexpr int64_t kMaxRows = 64;  // rows (query x head) per pass over the keys
// Larger heads (none in practice) take the reference path.
constexpr int64_t kMaxHeadDim = 256;

// Per-thread scratch: the transposed key block, the scores / weights of
// every row for one key block, the rows' partial outputs and an f16 block's
// V rows widened.  malloc'd, no std containers (the linkage rule).
template <class Isa>
struct Scratch {
  float* kt = nullptr;  // kMaxHeadDim x kKeyBlock
  float* s = nullptr;   // kMaxRows x kKeyBlock
  float* o = nullptr;   // kMaxRows x kMaxHeadDim
  float* v = nullptr;   // kKeyBlock x kMaxHeadDim
  Scratch() {
    kt = alloc(kMaxHeadDim * Isa::kKeyBlock);
    s = alloc(kMaxRows * Isa::kKeyBlock);
    o = alloc(kMaxRows * kMaxHeadDim);
    v = alloc(Isa::kKeyBlock * kMaxHeadDim);
    if (kt == nullptr || s == nullptr || o == nullptr || v == nullptr) {
      release();
      throw std::bad_alloc();
    }
  }
  ~Scratch() { release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

 private:
  static float* alloc(int64_t n) {
    return static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  }
  void release() {
    std::free(kt);
    std::free(s);
    std::free(o);
    std::free(v);
  }
};

template <class Isa>
Scratch<Isa>& scratch() {
  thread_local Scratch<Isa> buffers;
  return buffers;
}

// kt[d * kKeyBlock + j] = k[j * ld + d] for j < nb, d < hd; columns nb.. zero.
template <class Isa, class T>
void transpose_keys(const T* k, int64_t ld, int64_t nb, int64_t hd, float* kt) {
  constexpr int64_t kb = Isa::kKeyBlock, w = Isa::kLanes;
  if (nb < kb) {
    for (int64_t d = 0; d < hd; ++d) {
      for (int64_t j = nb; j < kb; ++j) kt[d * kb + j] = 0.0f;
    }
  }
  int64_t j = 0;
  for (; j + w <= nb; j += w) {
    const T* src = k + j * ld;
    int64_t d = 0;
    for (; d + w <= hd; d += w) Isa::transpose(src + d, ld, kt + d * kb + j, kb);
    for (; d < hd; ++d) {
      for (int64_t i = 0; i < w; ++i) kt[d * kb + j + i] = Isa::to_f32(src[i * ld + d]);
    }
  }
  for (; j < nb; ++j) {
    for (int64_t d = 0; d < hd; ++d) kt[d * kb + j] = Isa::to_f32(k[j * ld + d]);
  }
}

// The V rows [0, nb) of a key block as Isa::pv reads them, with their row
// stride in *ld: f32 rows in place; f16 rows widened into buf (hd apart).
template <class Isa>
const float* v_rows(const float* vb, int64_t, int64_t, float*, int64_t*) {
  return vb;
}
template <class Isa>
const float* v_rows(const uint16_t* vb, int64_t nb, int64_t hd, float* buf, int64_t* ld) {
  for (int64_t j = 0; j < nb; ++j) {
    const uint16_t* src = vb + j * *ld;
    float* dst = buf + j * hd;
    int64_t d = 0;
    for (; d + Isa::kLanes <= hd; d += Isa::kLanes) Isa::widen(src + d, dst + d);
    for (; d < hd; ++d) dst[d] = Isa::to_f32(src[d]);
  }
  *ld = hd;
  return buf;
}

// One pass over the keys for n_rows <= kMaxRows rows: row r is query
// q_begin + r / nh, head h_begin + r % nh.  key_blocks: the tile's KV
// head's keys, transposed (avx2::transpose_key_blocks), or null to
// transpose each block here.
template <class Isa, class T>
void attention_rows(const AttentionArgs& a, const float* key_blocks, int64_t q_begin, int64_t nq,
                    int64_t h_begin, int64_t nh, Scratch<Isa>& sc) {
  constexpr int64_t kb = Isa::kKeyBlock;
  constexpr int64_t group = Isa::kRowGroup;
  const int64_t hd = a.head_dim;
  const int64_t q_stride = a.n_head * hd;
  const int64_t kv_stride = a.n_head_kv * hd;
  const int64_t kv_head = h_begin / (a.n_head / a.n_head_kv);
  const T* kbase = static_cast<const T*>(a.k) + kv_head * hd;
  const T* vbase = static_cast<const T*>(a.v) + kv_head * hd;
  const int64_t n_rows = nq * nh;

  const float* qrow[kMaxRows];
  int64_t first_key[kMaxRows], n_keys[kMaxRows];  // each row sees keys [first_key, n_keys)
  int64_t lo[kMaxRows], hi[kMaxRows];
  float running_max[kMaxRows], carry[kMaxRows];
  typename Isa::Denom denom[kMaxRows];
  int64_t keys_needed = 0, first_needed = a.n_kv;
  const bool biased = a.key_bias.bias != 0.0f;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t qi = q_begin + r / nh, h = h_begin + r % nh;
    qrow[r] = a.q + qi * q_stride + h * hd;
    n_keys[r] = attention_key_end(a, qi);
    first_key[r] = attention_first_key(a, qi);
    keys_needed = n_keys[r] > keys_needed ? n_keys[r] : keys_needed;
    first_needed = first_key[r] < first_needed ? first_key[r] : first_needed;
    running_max[r] = -INFINITY;
    denom[r] = Isa::zero_denom();
    for (int64_t d = 0; d < hd; ++d) sc.o[r * hd + d] = 0.0f;
  }

  for (int64_t j0 = first_needed / kb * kb; j0 < keys_needed; j0 += kb) {
    const int64_t nb = keys_needed - j0 < kb ? keys_needed - j0 : kb;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t l = first_key[r] - j0, h = n_keys[r] - j0;
      lo[r] = l < 0 ? 0 : (l < nb ? l : nb);
      hi[r] = h < lo[r] ? lo[r] : (h < nb ? h : nb);
    }
    const float* kt = sc.kt;
    if (key_blocks != nullptr) {
      kt = key_blocks + j0 / kb * hd * kb;
    } else {
      transpose_keys<Isa>(kbase + j0 * kv_stride, kv_stride, nb, hd, sc.kt);
    }
    int64_t v_ld = kv_stride;
    const float* vb = v_rows<Isa>(vbase + j0 * kv_stride, nb, hd, sc.v, &v_ld);
    for (int64_t r0 = 0; r0 < n_rows; r0 += group) {
      const int mr = static_cast<int>(n_rows - r0 < group ? n_rows - r0 : group);
      int64_t nj = 0;
      for (int64_t r = r0; r < r0 + mr; ++r) nj = hi[r] > lo[r] && hi[r] > nj ? hi[r] : nj;
      if (nj == 0) continue;
      float* s = sc.s + r0 * kb;
      Isa::scores(mr, qrow + r0, kt, hd, s);
      for (int64_t r = r0; r < r0 + mr; ++r) {
        float* sr = sc.s + r * kb;
        if (biased) ref::add_key_bias(a, a.q_pos[q_begin + r / nh], j0, kb, sr);
        if (hi[r] > lo[r]) {
          carry[r] = Isa::softmax(sr, lo[r], hi[r], a.scale, &running_max[r], &denom[r]);
        } else {  // no visible key in this block: leave the row unchanged
          carry[r] = 1.0f;
          for (int64_t j = 0; j < kb; ++j) sr[j] = 0.0f;
        }
      }
      Isa::pv(mr, sc.o + r0 * hd, hd, carry + r0, s, nj, vb, v_ld);
    }
  }

  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t qi = q_begin + r / nh, h = h_begin + r % nh;
    float* out = a.out + qi * q_stride + h * hd;
    const float sum = Isa::denom_total(denom[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no visible key -> zeros
    for (int64_t d = 0; d < hd; ++d) out[d] = sc.o[r * hd + d] * inv;
  }
}

// Queries [q_begin, q_end) x heads [h_begin, h_end) (heads of one KV head),
// in passes of at most kMaxRows rows.
template <class Isa>
void attention_tile(const AttentionArgs& a, const float* key_blocks, int64_t q_begin, int64_t q_end,
                    int64_t h_begin, int64_t h_end) {
  const int64_t nh = h_end - h_begin;
  if (q_begin >= q_end || nh <= 0) return;
  if (a.head_dim > kMaxHeadDim || nh > kMaxRows) {
    for (int64_t qi = q_begin; qi < q_end; ++qi) {
      for (int64_t h = h_begin; h < h_end; ++h) ref::attention_one(a, qi, h);
    }
    return;
  }
  Scratch<Isa>& sc = scratch<Isa>();
  const int64_t q_step = kMaxRows / nh;
  for (int64_t q0 = q_begin; q0 < q_end; q0 += q_step) {
    const int64_t nq = q_end - q0 < q_step ? q_end - q0 : q_step;
    if (a.kv_type == DType::F16) {
      attention_rows<Isa, uint16_t>(a, key_blocks, q0, nq, h_begin, nh, sc);
    } else {
      attention_rows<Isa, float>(a, key_blocks, q0, nq, h_begin, nh, sc);
    }
  }
}

}  // namespace cb::tiles
