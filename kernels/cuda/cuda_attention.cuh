// Part of the CUDA backend (cuda_backend.cu, its only includer): attention
// kernels (few query rows), and the softmax and key sums of the cuBLAS path.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_attention_tiles.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace cb {
namespace {

// -------------------------------------------------------------- attention --

constexpr int kAttnWarps = 8;
constexpr int kMaxHeadDim = 256;
// attention() with at least this many query rows goes through cuBLAS
// (CudaBackend::attention_gemm), with at most this many bytes of scores at
// a time.
constexpr int64_t kAttnGemmMinRows = 32;
constexpr int64_t kAttnScoreBytes = int64_t{128} << 20;
constexpr int kDimsPerLane = kMaxHeadDim / 32;
// attention_kernel's split with CB_CUDA_ATTN_SPLIT: one pass of its warps.
constexpr int64_t kAttnSplitKeys = 32 * kAttnWarps;

// v[i] holds this lane's partial sum for key i of a 32-key tile; afterwards
// v[0] holds the full sum for key `lane`.  A butterfly reduce-scatter: at
// each step a lane keeps half of its keys and sends the other half to its
// partner, so the tile costs 31 shuffles instead of 32 reductions of 5.
__device__ __forceinline__ void reduce_scatter32(float* v, int lane) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int i = 0; i < off; ++i) {
      const float send = upper ? v[i] : v[i + off];
      const float keep = upper ? v[i + off] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
}

// A K/V element as f32: the cache holds f32, or f16 bits (widened exactly).
__device__ __forceinline__ float kv_load(const float* p) {
  return *p;
}
__device__ __forceinline__ float kv_load(const uint16_t* p) {
  return __half2float(__ushort_as_half(*p));
}

// KeyBlockBias::at on the device: the logit bias query position qp pays to
// key j (added to the scaled score, as the CPU kernels do).
__device__ __forceinline__ float key_bias_at(const KeyBlockBias& b, int64_t qp, int64_t j) {
  return qp >= b.query_from && j >= b.key_begin && j < b.key_end ? b.bias : 0.0f;
}

// The first key query row qi sees: past the sliding window, if any.
__device__ __forceinline__ int64_t first_visible_key(const AttentionArgs& a, int64_t qi) {
  return a.window > 0
             ? max(static_cast<int64_t>(0), static_cast<int64_t>(a.q_pos[qi]) + 1 - a.window)
             : 0;
}

// One block per (query row, head); its kAttnWarps warps split the visible
// keys into interleaved tiles of 32 and each runs an online softmax (running
// max m and sum l, accumulator rescaled by exp(m_old - m_new) when the max
// grows); the warps' partial results are merged at the end.  Within a warp
// every lane owns the output dimensions lane + 32 t and the matching query
// values, so K rows (for the scores) and V rows (for the output) are read
// coalesced.  K and V are read in place at KV head h / group (GQA without
// copies), as elements of T (float, or uint16_t f16 bits: AttentionArgs::kv_type).
// With split_keys > 0 (CB_CUDA_ATTN_SPLIT) the keys are cut into splits of
// split_keys from key 0 and block (row, head) of grid row y takes split y
// only, writing its partial result where attention_merge_kernel reads it
// (tile_partial_offset: the sums of weighted V rows relative to the split's
// largest score m, then m and the sum of the weights): a decode row over a
// long context is then many blocks instead of one per head walking every
// key.  A split the row sees no key of writes nothing (the merge does not
// read it).
template <class T>
__global__ void attention_kernel(AttentionArgs a, int64_t group, int64_t split_keys,
                                 float* partial) {
  extern __shared__ float smem[];  // [kAttnWarps][head_dim] accumulators, m, l
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t qi = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, kvh = h / group;
  const int64_t hd = a.head_dim;
  const int64_t q_stride = a.n_head * hd, kv_stride = a.n_head_kv * hd;
  const float* q = a.q + qi * q_stride + h * hd;
  const T* kbase = static_cast<const T*>(a.k) + kvh * hd;
  const T* vbase = static_cast<const T*>(a.v) + kvh * hd;
  float qr[kDimsPerLane];
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int64_t d = lane + 32 * t;
    qr[t] = d < hd ? q[d] : 0.0f;
  }

  const int64_t qp = a.q_pos[qi];
  int64_t n_keys = min(qp + 1, a.n_kv);
  int64_t first = first_visible_key(a, qi);
  if (split_keys > 0) {
    const int64_t lo = static_cast<int64_t>(blockIdx.y) * split_keys;
    first = max(first, lo);
    n_keys = min(n_keys, lo + split_keys);
    if (n_keys <= first) return;  // the whole block: no barrier is left waiting
  }
  float acc[kDimsPerLane] = {};
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = first + 32 * warp; j0 < n_keys; j0 += 32 * kAttnWarps) {
    const int n_tile = static_cast<int>(min(static_cast<int64_t>(32), n_keys - j0));
    // Rows past the tile's end are clamped to its last key rather than
    // skipped, so every load is unconditional and all 32 rows are in flight
    // at once; their scores are masked below.
    float part[32];
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      const T* k = kbase + (j0 + min(kk, n_tile - 1)) * kv_stride;
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) {
        const int64_t d = lane + 32 * t;
        if (d < hd) dot += qr[t] * kv_load(k + d);
      }
      part[kk] = dot;
    }
    reduce_scatter32(part, lane);
    const float s =
        lane < n_tile ? part[0] * a.scale + key_bias_at(a.key_bias, qp, j0 + lane) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // finite: key j0 is visible
    const float corr = expf(m - m_new);         // 0 on the first tile (m = -inf)
    const float p = lane < n_tile ? expf(s - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) acc[t] *= corr;
    // V rows in batches of 8, loaded before they are used (again clamped to
    // the last key), so a warp waits for memory once per batch, not per row.
    for (int jb = 0; jb < n_tile; jb += 8) {
      float vv[8][kDimsPerLane];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const T* v = vbase + (j0 + min(jb + u, n_tile - 1)) * kv_stride;
#pragma unroll
        for (int t = 0; t < kDimsPerLane; ++t) {
          const int64_t d = lane + 32 * t;
          vv[u][t] = d < hd ? kv_load(v + d) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float pj = __shfl_sync(0xffffffffu, p, jb + u);  // 0 past the tile
        if (jb + u < n_tile) {
#pragma unroll
          for (int t = 0; t < kDimsPerLane; ++t) acc[t] += pj * vv[u][t];
        }
      }
    }
    m = m_new;
  }

  // Merge: out = sum_w acc_w exp(m_w - M) / sum_w l_w exp(m_w - M), over the
  // warps that saw a key (m_w = -inf contributes nothing).
  float* acc_s = smem;
  float* m_s = smem + kAttnWarps * hd;
  float* l_s = m_s + kAttnWarps;
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int64_t d = lane + 32 * t;
    if (d < hd) acc_s[warp * hd + d] = acc[t];
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();
  float* out = a.out + qi * q_stride + h * hd;
  if (n_keys <= first) {  // no visible key: zero output
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) out[d] = 0.0f;
    return;
  }
  float big_m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) big_m = fmaxf(big_m, m_s[w]);
  float scale_w[kAttnWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    scale_w[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - big_m);
    total += l_s[w] * scale_w[w];
  }
  const float inv_total = 1.0f / total;
  float* dst = out;
  if (split_keys > 0) {
    dst = partial + tile_partial_offset(a, blockIdx.y, qi, h);
    if (threadIdx.x == 0) {
      dst[hd] = big_m;
      dst[hd + 1] = total;
    }
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += acc_s[w * hd + d] * scale_w[w];
    dst[d] = split_keys > 0 ? o : o * inv_total;
  }
}

// Attention of many query rows through cuBLAS (see CudaBackend::attention):
// the scores of a block of rows are a GEMM per head, then this kernel, one
// block per (head, row), turns each row of scores into softmax weights over
// the keys that row sees after a.key_bias (0 elsewhere; all 0 when it sees
// none), then a
// second GEMM per head applies them to V.  Rows are scores[(h * rows + i) *
// n_kv + j] for query row r0 + i.
__global__ void attn_softmax_rows_kernel(AttentionArgs a, int64_t r0, int64_t rows, float* scores) {
  const int64_t h = blockIdx.x / rows, i = blockIdx.x % rows;
  float* s = scores + (h * rows + i) * a.n_kv;
  const int64_t qi = r0 + i;
  const int64_t first = first_visible_key(a, qi);
  const int64_t qp = a.q_pos[qi];
  const int64_t end = min(qp + 1, a.n_kv);  // may be <= 0
  auto score = [&](int64_t j) { return s[j] + key_bias_at(a.key_bias, qp, j); };
  float m = -INFINITY;
  for (int64_t j = first + threadIdx.x; j < end; j += blockDim.x) m = fmaxf(m, score(j));
  m = block_max(m);
  float l = 0.0f;
  for (int64_t j = first + threadIdx.x; j < end; j += blockDim.x) l += expf(score(j) - m);
  l = static_cast<float>(block_sum(static_cast<double>(l)));
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t j = threadIdx.x; j < a.n_kv; j += blockDim.x) {
    s[j] = j >= first && j < end ? expf(score(j) - m) * inv : 0.0f;
  }
}

// K or V in f32 for the GEMMs (an f16 cache widened exactly).
__global__ void widen_f16_kernel(const uint16_t* __restrict__ in, int64_t n,
                                 float* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = kv_load(in + i);
  }
}

// attention_contributions' sums over one block of rows' softmax weights
// (attn_softmax_rows_kernel's layout), one thread per key, in a fixed order
// (deterministic): out[j] += sum over KV heads g of |V_j,g| times the
// weights of key j over g's query heads and the block's rows.  v is f32.
__global__ void attn_key_sums_kernel(AttentionArgs a, int64_t rows, const float* __restrict__ w,
                                     const float* __restrict__ v, float* out) {
  const int64_t group = a.n_head / a.n_head_kv;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < a.n_kv;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float total = 0.0f;
    for (int64_t g = 0; g < a.n_head_kv; ++g) {
      const float* vj = v + (j * a.n_head_kv + g) * a.head_dim;
      float norm = 0.0f;
      for (int64_t d = 0; d < a.head_dim; ++d) norm += vj[d] * vj[d];
      float sum = 0.0f;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < rows; ++i) sum += w[(h * rows + i) * a.n_kv + j];
      }
      total += sum * sqrtf(norm);
    }
    out[j] += total;
  }
}

}  // namespace
}  // namespace cb
