// AVX2 attention for one (query row, head): online softmax over blocks of
// kBlock keys.  Scores of a block are computed first, the running maximum is
// updated once per block (rescaling the partial output only when it grows),
// and the block's exponentials are evaluated 8 at a time.  K and V are read
// in place: GQA maps the query head to its KV head by index, nothing is
// copied.
#include <cmath>

#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

constexpr int64_t kBlock = 32;
// The partial output lives on the stack; larger heads (none in practice)
// take the reference path.
constexpr int64_t kMaxHeadDim = 512;

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = y * a + p * v  over n elements.
inline void scale_axpy(float* y, float a, float p, const float* v, int64_t n) {
  const __m256 va = _mm256_set1_ps(a), vp = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i),
                                            _mm256_mul_ps(va, _mm256_loadu_ps(y + i))));
  }
  for (; i < n; ++i) y[i] = y[i] * a + p * v[i];
}

inline void axpy(float* y, float p, const float* v, int64_t n) {
  const __m256 vp = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += p * v[i];
}

}  // namespace

void attention_one(const AttentionArgs& a, int64_t qi, int64_t head) {
  const int64_t hd = a.head_dim;
  if (hd > kMaxHeadDim) return ref::attention_one(a, qi, head);
  const int64_t q_stride = a.n_head * hd;
  const int64_t kv_stride = a.n_head_kv * hd;
  const int64_t kv_head = head / (a.n_head / a.n_head_kv);
  const float* q = a.q + qi * q_stride + head * hd;
  const float* k = a.k + kv_head * hd;
  const float* v = a.v + kv_head * hd;
  float* out = a.out + qi * q_stride + head * hd;
  const int64_t last = static_cast<int64_t>(a.q_pos[qi]);
  const int64_t n_keys = last + 1 < a.n_kv ? last + 1 : a.n_kv;

  alignas(32) float acc[kMaxHeadDim];
  for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
  float running_max = -INFINITY;
  float denom = 0.0f;

  for (int64_t j0 = 0; j0 < n_keys; j0 += kBlock) {
    const int64_t nb = n_keys - j0 < kBlock ? n_keys - j0 : kBlock;
    alignas(32) float p[kBlock];
    float block_max = -INFINITY;
    for (int64_t j = 0; j < nb; ++j) {
      p[j] = dot(q, k + (j0 + j) * kv_stride, hd) * a.scale;
      block_max = p[j] > block_max ? p[j] : block_max;
    }
    // Rescale what was accumulated so far only when the maximum grows.
    float carry = 1.0f;
    if (block_max > running_max) {
      carry = __builtin_expf(running_max - block_max);  // 0 on the first block
      running_max = block_max;
    }
    const __m256 vmax = _mm256_set1_ps(running_max);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; j += 8) {
      // Lanes past the last key are masked to exactly 0.
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256 live = _mm256_castsi256_ps(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nb - j)), lane));
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_load_ps(p + j), vmax)), live);
      _mm256_store_ps(p + j, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    denom = denom * carry + hsum(vsum);
    const float* vb = v + j0 * kv_stride;
    scale_axpy(acc, carry, p[0], vb, hd);
    for (int64_t j = 1; j < nb; ++j) axpy(acc, p[j], vb + j * kv_stride, hd);
  }

  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;  // no visible key -> zeros
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
}

}  // namespace cb::avx2
