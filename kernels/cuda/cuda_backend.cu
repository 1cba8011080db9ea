// The CUDA backend.  Semantics are those of the scalar reference kernels
// (kernels/cpu/reference_ops.h), op by op:
//
//  - Weight decoding reproduces dequantize_row() bit for bit: the same f32
//    operations in the same order, written with __fmul_rn / __fadd_rn so
//    that nvcc cannot contract them into FMAs (which would change the last
//    bit).  get_rows() is therefore exact.
//  - matmul: up to gemv_max_rows activation rows run a GEMV that decodes the
//    quantized blocks in registers (decode reads each weight once per token,
//    so it is bound by weight bytes and must not expand them); more rows
//    (prefill) dequantize the weight, a slice of output rows at a time, to
//    f32 in a scratch buffer and call cuBLAS SGEMM.  f32 and not f16: the
//    prefill logits are held to a float64 reference at a relative L2 of
//    1e-3, and rounding both activations and weights to f16 would spend a
//    large part of that budget; f32 SGEMM on any recent GPU is still far
//    faster than the CPU path.  (An f16/bf16 tensor-core path is future
//    work, see docs/CUDA.md.)
//  - rmsnorm and row_sq_diff accumulate in f64 like the reference; rope
//    computes its angles in f64 and rounds once; attention is an online
//    (one pass) softmax, so it matches the two-pass reference to rounding.
//
// Synchronisation: every op enqueues on the backend's own stream and waits
// for it before returning, because the runtime's host code reads results
// (logits, KV deviations) right after a call.  Managed memory is only
// touched by the host between calls, which is also what devices without
// concurrent managed access (Jetson) require.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cuda/cuda_backend.h"
#include "platform/error.h"

namespace cb {
namespace {

// ---------------------------------------------------------------- errors --

void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const ErrorCode code =
      e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  fail(code, std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}

void cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const ErrorCode code =
      s == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  fail(code, std::string("cuda backend: ") + what + ": cuBLAS status " +
                 std::to_string(static_cast<int>(s)));
}

void check(bool ok, const char* what) {
  if (!ok) fail(ErrorCode::kInvalidArgument, std::string("cuda backend: ") + what);
}

// Launch errors (bad configuration) surface at the launch; execution errors
// surface at the synchronisation that ends every op.
void launch_check(const char* kernel) {
  cuda_check(cudaGetLastError(), kernel);
}

// ------------------------------------------------------ weight decoding --

__device__ __forceinline__ float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// bfloat16 is the top half of an f32 (exact).
__device__ __forceinline__ float bf2f(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ void q4k_scale_min_dev(const uint8_t* scales, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *m = scales[s + 4] & 63;
  } else {
    *sc = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4);
    *m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

constexpr bool is_float_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// Element i of a row of a float type.
template <DType T>
__device__ __forceinline__ float load_elem(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (T == DType::F16) {
    return h2f(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    return bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
  }
}

// Elements [32 g + e0, 32 g + e0 + N) of a quantized row, in element order
// (e0 a multiple of N, N dividing 32).  32 is the sub-block size of every
// quantized type, so a group meets one scale (Q6_K: two groups of 16).  The
// expressions mirror dequantize.cpp; element e of the group is:
//   Q4_0, Q4_1: qs[e % 16], low nibble for e < 16, high nibble after
//   Q4_K: sub-block s = g % 8 lives in chunk s / 2 (low or high nibbles)
//   Q6_K: see BlockQ6_K (s / 4 is the half, s % 4 the 32-element run)
template <DType T, int N>
__device__ __forceinline__ void decode_part(const uint8_t* row, int64_t g, int e0, float* w) {
  if constexpr (T == DType::Q4_0) {
    const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + g;
    const float d = h2f(b->d);
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int e = e0 + l;
      const int q = (b->qs[e % 16] >> (4 * (e / 16))) & 0x0F;
      w[l] = __fmul_rn(static_cast<float>(q - 8), d);
    }
  } else if constexpr (T == DType::Q4_1) {
    const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + g;
    const float d = h2f(b->d), m = h2f(b->m);
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int e = e0 + l;
      const int q = (b->qs[e % 16] >> (4 * (e / 16))) & 0x0F;
      w[l] = __fadd_rn(__fmul_rn(static_cast<float>(q), d), m);
    }
  } else if constexpr (T == DType::Q8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + g;
    const float d = h2f(b->d);
#pragma unroll
    for (int l = 0; l < N; ++l) w[l] = __fmul_rn(static_cast<float>(b->qs[e0 + l]), d);
  } else if constexpr (T == DType::Q4_K) {
    const BlockQ4_K* b = reinterpret_cast<const BlockQ4_K*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    int sc, m;
    q4k_scale_min_dev(b->scales, s, &sc, &m);
    const float dd = __fmul_rn(h2f(b->d), static_cast<float>(sc));
    const float mm = __fmul_rn(h2f(b->dmin), static_cast<float>(m));
    const uint8_t* q = b->qs + 32 * (s / 2) + e0;
    const int shift = (s % 2) * 4;
#pragma unroll
    for (int l = 0; l < N; ++l) {
      w[l] = __fsub_rn(__fmul_rn(dd, static_cast<float>((q[l] >> shift) & 0x0F)), mm);
    }
  } else if constexpr (T == DType::Q6_K) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    const int half = s / 4, quarter = s % 4;
    const uint8_t* ql = b->ql + 64 * half + 32 * (quarter % 2) + e0;
    const uint8_t* qh = b->qh + 32 * half + e0;
    const int lshift = (quarter / 2) * 4, hshift = 2 * quarter;
    const float d = h2f(b->d);
    const int8_t* sc = b->scales + 8 * half + 2 * quarter;
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int q = (((ql[l] >> lshift) & 0x0F) | (((qh[l] >> hshift) & 3) << 4)) - 32;
      const float ds = __fmul_rn(d, static_cast<float>(sc[(e0 + l) / 16]));
      w[l] = __fmul_rn(ds, static_cast<float>(q));
    }
  }
}

// ---------------------------------------------------------------- GEMV --

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 4;  // output rows per 128-thread block

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Bytes of 8 consecutive 32-element groups (one GEMV step): 8 blocks of the
// 32-element types, one super-block of the K-quants.
template <DType T>
constexpr int step_bytes() {
  switch (T) {
    case DType::Q4_0:
      return 8 * static_cast<int>(sizeof(BlockQ4_0));
    case DType::Q4_1:
      return 8 * static_cast<int>(sizeof(BlockQ4_1));
    case DType::Q8_0:
      return 8 * static_cast<int>(sizeof(BlockQ8_0));
    case DType::Q4_K:
      return static_cast<int>(sizeof(BlockQ4_K));
    case DType::Q6_K:
      return static_cast<int>(sizeof(BlockQ6_K));
    default:
      return 0;
  }
}
constexpr int kGemvStageBytes = 8 * static_cast<int>(sizeof(BlockQ8_0));  // the largest step

// One warp per output row o.  Quantized types go in steps of 8 groups of 32
// elements: the warp first copies the step's blocks to shared memory with
// coalesced 16-bit loads (blocks are only 2-byte aligned, and reading them
// byte by byte from global memory made the kernel bound by load
// instructions), then each group is shared by 4 lanes of 8 elements, which
// decode their weights from shared memory and dot them with every
// activation row (x loads are whole 128-byte lines).  The weight is read
// once for all n_rows.  The accumulators are indexed only by unrolled
// constants (the `r < n_rows` guard), so they stay in registers.
template <DType T>
__global__ void gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                            int64_t n_out, const float* __restrict__ x, int n_rows,
                            float* __restrict__ y) {
  __shared__ __align__(16) uint16_t stage[kGemvWarps][kGemvStageBytes / 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (o >= n_out) return;  // whole warps leave; only warp-level barriers below
  const uint8_t* row = w + static_cast<size_t>(o) * row_bytes;
  float acc[kGemvMaxRows] = {};
  if constexpr (is_float_type(T)) {
    for (int64_t i = lane; i < n_in; i += 32) {
      const float wv = load_elem<T>(row, i);
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r < n_rows) acc[r] += wv * x[r * n_in + i];
      }
    }
  } else {
    constexpr int kStep = step_bytes<T>();
    const int64_t n_groups = n_in / 32;
    const int e0 = 8 * (lane % 4), gl = lane / 4;
    uint16_t* st = stage[warp];
    float wv[8];
    for (int64_t g0 = 0; g0 < n_groups; g0 += 8) {
      // A partial last step only happens for the 32-element types (K-quant
      // rows are whole super-blocks), whose blocks are kStep / 8 bytes.
      const int n_g = static_cast<int>(min(static_cast<int64_t>(8), n_groups - g0));
      const int halves = (n_g == 8 ? kStep : n_g * (kStep / 8)) / 2;  // Q6_K: 210 / 8 is not whole
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row + (g0 / 8) * kStep);
      __syncwarp();  // the previous step's reads of st are done
      for (int i = lane; i < halves; i += 32) st[i] = src[i];
      __syncwarp();
      if (gl < n_g) {
        decode_part<T, 8>(reinterpret_cast<const uint8_t*>(st), gl, e0, wv);
#pragma unroll
        for (int r = 0; r < kGemvMaxRows; ++r) {
          if (r < n_rows) {
            const float* xr = x + r * n_in + 32 * (g0 + gl) + e0;
            float s = 0.0f;
#pragma unroll
            for (int l = 0; l < 8; ++l) s += wv[l] * xr[l];
            acc[r] += s;
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < n_rows) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) y[r * n_out + o] = s;
    }
  }
}

// ------------------------------------------------- dequantize / get_rows --

// out[r] = decoded weight row (ids ? ids[r] : row0 + r), for r < n.  One
// thread per 32-element group (per element for the float types).
template <DType T>
__global__ void dequant_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                                    const int32_t* __restrict__ ids, int64_t row0, int64_t n,
                                    float* __restrict__ out) {
  const int64_t per_row = is_float_type(T) ? n_in : n_in / 32;
  const int64_t total = n * per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / per_row, g = t % per_row;
    const int64_t src = ids != nullptr ? static_cast<int64_t>(ids[r]) : row0 + r;
    const uint8_t* row = w + static_cast<size_t>(src) * row_bytes;
    float* o = out + r * n_in;
    if constexpr (is_float_type(T)) {
      o[g] = load_elem<T>(row, g);
    } else {
      float v[32];
      decode_part<T, 32>(row, g, 0, v);
#pragma unroll
      for (int l = 0; l < 32; ++l) o[32 * g + l] = v[l];
    }
  }
}

// --------------------------------------------------------- row kernels --

constexpr int kRowThreads = 256;

// Sum of a double over the block (kRowThreads threads); every thread gets it.
__device__ double block_sum(double v) {
  __shared__ double part[kRowThreads / 32];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
#pragma unroll
  for (int i = 0; i < kRowThreads / 32; ++i) s += part[i];
  __syncthreads();  // part[] may be reused by a later call
  return s;
}

// One block per row; f64 sum of squares as in ref::rmsnorm.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                               int64_t dim, float eps, float* __restrict__ out) {
  const float* xr = x + blockIdx.x * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kRowThreads) {
    sum += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
  }
  sum = block_sum(sum);
  const float scale =
      static_cast<float>(1.0 / sqrt(sum / static_cast<double>(dim) + static_cast<double>(eps)));
  float* yr = out + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kRowThreads) {
    yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), weight[i]);
  }
}

__global__ void row_sq_diff_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   int64_t row_len, float* __restrict__ out) {
  const int64_t base = blockIdx.x * row_len;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < row_len; j += kRowThreads) {
    const double d = static_cast<double>(a[base + j]) - static_cast<double>(b[base + j]);
    sum += d * d;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(sum);
}

// One thread per (row, rotated pair): the angle in f64 (as ref::rope), then
// the same rotation for every head of the row.
__global__ void rope_kernel(float* x, const int32_t* __restrict__ pos, int64_t n_rows,
                            int64_t n_heads, int64_t head_dim, int64_t rot_dim, float freq_base) {
  const int64_t n_pairs = rot_dim / 2;
  const int64_t total = n_rows * n_pairs;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / n_pairs, i = t % n_pairs;
    const double inv_freq = pow(static_cast<double>(freq_base),
                                -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    const double angle = static_cast<double>(pos[r]) * inv_freq;
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim + 2 * i;
      const float a = v[0], b = v[1];
      v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      v[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
  }
}

// -------------------------------------------------------------- attention --

constexpr int kAttnWarps = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

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

// One block per (query row, head); its kAttnWarps warps split the visible
// keys into interleaved tiles of 32 and each runs an online softmax (running
// max m and sum l, accumulator rescaled by exp(m_old - m_new) when the max
// grows); the warps' partial results are merged at the end.  Within a warp
// every lane owns the output dimensions lane + 32 t and the matching query
// values, so K rows (for the scores) and V rows (for the output) are read
// coalesced.  K and V are read in place at KV head h / group (GQA without
// copies).
__global__ void attention_kernel(AttentionArgs a, int64_t group) {
  extern __shared__ float smem[];  // [kAttnWarps][head_dim] accumulators, m, l
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t qi = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, kvh = h / group;
  const int64_t hd = a.head_dim;
  const int64_t q_stride = a.n_head * hd, kv_stride = a.n_head_kv * hd;
  const float* q = a.q + qi * q_stride + h * hd;
  const float* kbase = a.k + kvh * hd;
  const float* vbase = a.v + kvh * hd;
  float qr[kDimsPerLane];
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int64_t d = lane + 32 * t;
    qr[t] = d < hd ? q[d] : 0.0f;
  }

  const int64_t n_keys = min(static_cast<int64_t>(a.q_pos[qi]) + 1, a.n_kv);
  float acc[kDimsPerLane] = {};
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 32 * warp; j0 < n_keys; j0 += 32 * kAttnWarps) {
    const int n_tile = static_cast<int>(min(static_cast<int64_t>(32), n_keys - j0));
    // Rows past the tile's end are clamped to its last key rather than
    // skipped, so every load is unconditional and all 32 rows are in flight
    // at once; their scores are masked below.
    float part[32];
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      const float* k = kbase + (j0 + min(kk, n_tile - 1)) * kv_stride;
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) {
        const int64_t d = lane + 32 * t;
        if (d < hd) dot += qr[t] * k[d];
      }
      part[kk] = dot;
    }
    reduce_scatter32(part, lane);
    const float s = lane < n_tile ? part[0] * a.scale : -INFINITY;
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
        const float* v = vbase + (j0 + min(jb + u, n_tile - 1)) * kv_stride;
#pragma unroll
        for (int t = 0; t < kDimsPerLane; ++t) {
          const int64_t d = lane + 32 * t;
          vv[u][t] = d < hd ? v[d] : 0.0f;
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
  if (n_keys <= 0) {  // no visible key: zero output
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
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += acc_s[w * hd + d] * scale_w[w];
    out[d] = o * inv_total;
  }
}

// ------------------------------------------------------ element kernels --

#define CB_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = __fmul_rn(g / (1.0f + expf(-g)), up[i]);
  }
}

// No __restrict__: out may alias a or b.
__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    out[i] = a[i] + b[i];
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ src, int64_t row_len,
                                   const int32_t* __restrict__ idx, int64_t n,
                                   float* __restrict__ dst) {
  CB_GRID_STRIDE(t, n * row_len) {
    const int64_t r = t / row_len, j = t % row_len;
    dst[t] = src[static_cast<int64_t>(idx[r]) * row_len + j];
  }
}

__global__ void scatter_rows_kernel(const float* __restrict__ src, int64_t row_len,
                                    const int32_t* __restrict__ idx, int64_t n,
                                    float* __restrict__ dst) {
  CB_GRID_STRIDE(t, n * row_len) {
    const int64_t r = t / row_len, j = t % row_len;
    dst[static_cast<int64_t>(idx[r]) * row_len + j] = src[t];
  }
}

#undef CB_GRID_STRIDE

constexpr int kEltThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill any current GPU
// many times over, capped so the grid size stays far inside its limits.
unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kEltThreads - 1) / kEltThreads, 1, 65536));
}

// ------------------------------------------------------------- backend --

// Bytes of f32 scratch for the dequantized weight of the SGEMM path: the
// weight is converted a slice of output rows at a time, so memory stays
// bounded whatever the vocabulary size.
constexpr size_t kGemmScratchBytes = size_t{64} << 20;

// Kernel launchers, one class template per kernel so dispatch_type() can
// pick the instantiation for a weight type at run time.
template <DType T>
struct LaunchGemv {
  static void run(const WeightView& w, const float* x, int n_rows, float* y, cudaStream_t st) {
    const unsigned blocks = static_cast<unsigned>((w.n_out + kGemvWarps - 1) / kGemvWarps);
    gemv_kernel<T><<<blocks, 32 * kGemvWarps, 0, st>>>(static_cast<const uint8_t*>(w.data),
                                                       dtype_row_bytes(w.type, w.n_in), w.n_in,
                                                       w.n_out, x, n_rows, y);
    launch_check("gemv_kernel");
  }
};

template <DType T>
struct LaunchDequant {
  static void run(const WeightView& w, const int32_t* ids, int64_t row0, int64_t n, float* out,
                  cudaStream_t st) {
    const int64_t per_row = is_float_type(T) ? w.n_in : w.n_in / 32;
    dequant_rows_kernel<T><<<grid_for(n * per_row), kEltThreads, 0, st>>>(
        static_cast<const uint8_t*>(w.data), dtype_row_bytes(w.type, w.n_in), w.n_in, ids, row0, n,
        out);
    launch_check("dequant_rows_kernel");
  }
};

// Op<t>::run(args...) for the weight type t.
template <template <DType> class Op, class... Args>
void dispatch_type(DType t, Args&&... args) {
  switch (t) {
    case DType::F32:
      return Op<DType::F32>::run(args...);
    case DType::F16:
      return Op<DType::F16>::run(args...);
    case DType::BF16:
      return Op<DType::BF16>::run(args...);
    case DType::Q4_0:
      return Op<DType::Q4_0>::run(args...);
    case DType::Q4_1:
      return Op<DType::Q4_1>::run(args...);
    case DType::Q8_0:
      return Op<DType::Q8_0>::run(args...);
    case DType::Q4_K:
      return Op<DType::Q4_K>::run(args...);
    case DType::Q6_K:
      return Op<DType::Q6_K>::run(args...);
  }
  fail(ErrorCode::kUnsupported, "cuda backend: unsupported weight type");
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& opts)
      : device_(device), gemv_max_rows_(std::clamp(opts.gemv_max_rows, 0, kGemvMaxRows)) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    int pools = 0;
    cuda_check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_),
               "cudaDeviceGetAttribute");
    async_alloc_ = pools != 0;
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) {
      cudaStreamDestroy(stream_);
      fail(ErrorCode::kInternal, "cuda backend: cublasCreate failed");
    }
    cublas_check(cublasSetStream(blas_, stream_), "cublasSetStream");
    // Plain f32 arithmetic (no TF32 tensor cores): see the numerics note at
    // the top of this file.
    cublas_check(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }

  ~CudaBackend() override {
    // Errors cannot be reported from a destructor; the process is usually
    // exiting or the session is being torn down.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (void* p : weights_) cudaFree(p);
    drop_mirrors();
    cudaFree(gemm_scratch_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }

  void* alloc_buffer(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    use_device();
    void* p = nullptr;
    // Managed memory is 256-byte aligned (> the interface's 64).  Any
    // refusal is reported as out of memory, as the CPU backend does.
    const cudaError_t e = cudaMallocManaged(&p, bytes == 0 ? 1 : bytes, cudaMemAttachGlobal);
    if (e != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory, "cuda backend: cannot allocate " + std::to_string(bytes) +
                                        " bytes of managed memory: " + cudaGetErrorString(e));
    }
    owned_[reinterpret_cast<uintptr_t>(p)] = bytes == 0 ? 1 : bytes;
    return p;
  }

  void free_buffer(void* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    use_device();
    owned_.erase(reinterpret_cast<uintptr_t>(p));
    cuda_check(cudaFree(p), "cudaFree");
  }

  WeightView prepare_weight(const WeightView& host) override {
    check(host.n_in >= 0 && host.n_out >= 0, "prepare_weight: negative size");
    check(host.n_in % dtype_block_elems(host.type) == 0,
          "prepare_weight: n_in is not a whole number of blocks");
    const size_t bytes = dtype_row_bytes(host.type, host.n_in) * static_cast<size_t>(host.n_out);
    WeightView dev = host;
    if (bytes == 0) {
      dev.data = nullptr;
      return dev;
    }
    std::lock_guard<std::mutex> lock(mu_);
    use_device();
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (weight)");
    const cudaError_t e = cudaMemcpy(p, host.data, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) {
      cudaFree(p);
      cuda_check(e, "cudaMemcpy (weight upload)");
    }
    weights_.push_back(p);
    owned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    dev.data = p;
    return dev;
  }

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (n_rows == 0 || w.n_out == 0) return;
    Call c(*this);
    const float* dx = c.in(x, n_rows * w.n_in);
    float* dy = c.out(y, n_rows * w.n_out, false);
    if (w.n_in == 0) {
      cuda_check(
          cudaMemsetAsync(dy, 0, static_cast<size_t>(n_rows * w.n_out) * sizeof(float), stream_),
          "cudaMemsetAsync");
    } else if (n_rows <= gemv_max_rows_) {
      dispatch_type<LaunchGemv>(w.type, w, dx, static_cast<int>(n_rows), dy, stream_);
    } else {
      gemm(w, dx, n_rows, dy);
    }
    c.finish();
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    check(n >= 0, "get_rows: negative count");
    if (n == 0 || w.n_in == 0) return;
    Call c(*this);
    const int32_t* dids = c.in(ids, n);
    float* dout = c.out(out, n * w.n_in, false);
    dispatch_type<LaunchDequant>(w.type, w, dids, int64_t{0}, n, dout, stream_);
    c.finish();
  }

  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    check(n_rows >= 0 && dim > 0, "rmsnorm: bad shape");
    check(n_rows <= INT32_MAX, "rmsnorm: too many rows");
    if (n_rows == 0) return;
    Call c(*this);
    const float* dx = c.in(x, n_rows * dim);
    const float* dw = c.in(weight, dim);
    float* dout = c.out(out, n_rows * dim, false);
    rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, stream_>>>(dx, dw, dim, eps,
                                                                               dout);
    launch_check("rmsnorm_kernel");
    c.finish();
  }

  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base) override {
    check(n_rows >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape");
    check(rot_dim >= 0 && rot_dim <= head_dim && rot_dim % 2 == 0,
          "rope: rot_dim must be even and at most head_dim");
    if (n_rows == 0 || rot_dim == 0) return;
    Call c(*this);
    float* dx = c.out(x, n_rows * n_heads * head_dim, true);
    const int32_t* dpos = c.in(pos, n_rows);
    const int64_t total = n_rows * (rot_dim / 2);
    rope_kernel<<<grid_for(total), kEltThreads, 0, stream_>>>(dx, dpos, n_rows, n_heads, head_dim,
                                                              rot_dim, freq_base);
    launch_check("rope_kernel");
    c.finish();
  }

  void attention(const AttentionArgs& a) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention: bad shape");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention: n_head must be a multiple of n_head_kv");
    if (a.head_dim > kMaxHeadDim) {
      fail(ErrorCode::kUnsupported, "cuda backend: attention head_dim above " +
                                        std::to_string(kMaxHeadDim) + " is not supported");
    }
    if (a.n_q == 0) return;
    Call c(*this);
    AttentionArgs d = a;
    const int64_t q_elems = a.n_q * a.n_head * a.head_dim;
    const int64_t kv_elems = a.n_kv * a.n_head_kv * a.head_dim;
    d.q = c.in(a.q, q_elems);
    d.q_pos = c.in(a.q_pos, a.n_q);
    d.k = c.in(a.k, kv_elems);
    d.v = c.in(a.v, kv_elems);
    d.out = c.out(a.out, q_elems, false);
    check(a.n_q * a.n_head <= INT32_MAX, "attention: too many query rows x heads");
    const size_t smem = static_cast<size_t>(kAttnWarps * (a.head_dim + 2)) * sizeof(float);
    attention_kernel<<<static_cast<unsigned>(a.n_q * a.n_head), 32 * kAttnWarps, smem, stream_>>>(
        d, a.n_head / a.n_head_kv);
    launch_check("attention_kernel");
    c.finish();
  }

  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(n >= 0, "silu_mul: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* dg = c.in(gate, n);
    const float* du = c.in(up, n);
    float* dout = c.out(out, n, false);
    silu_mul_kernel<<<grid_for(n), kEltThreads, 0, stream_>>>(dg, du, n, dout);
    launch_check("silu_mul_kernel");
    c.finish();
  }

  void add(const float* a, const float* b, int64_t n, float* out) override {
    check(n >= 0, "add: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* da = c.in(a, n);
    const float* db = c.in(b, n);
    float* dout = c.out(out, n, false);
    add_kernel<<<grid_for(n), kEltThreads, 0, stream_>>>(da, db, n, dout);
    launch_check("add_kernel");
    c.finish();
  }

  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    // The source rows are only known on the device (idx may be device
    // memory), so a host source is staged whole; the runtime passes arena
    // buffers, which are managed.
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in_unknown_extent(src, row_len, idx, n);
    float* ddst = c.out(dst, n * row_len, false);
    gather_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, stream_>>>(dsrc, row_len, didx, n,
                                                                           ddst);
    launch_check("gather_rows_kernel");
    c.finish();
  }

  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    check(n >= 0 && row_len >= 0, "scatter_rows: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in(src, n * row_len);
    // dst must be device-accessible: its extent is not part of the call.
    check(accessible(dst), "scatter_rows: dst must be backend memory");
    scatter_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, stream_>>>(dsrc, row_len, didx, n,
                                                                            dst);
    launch_check("scatter_rows_kernel");
    c.finish();
  }

  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    check(n_rows >= 0 && row_len >= 0, "row_sq_diff: negative size");
    check(n_rows <= INT32_MAX, "row_sq_diff: too many rows");
    if (n_rows == 0) return;
    Call c(*this);
    const float* da = c.in(a, n_rows * row_len);
    const float* db = c.in(b, n_rows * row_len);
    float* dout = c.out(out, n_rows, false);
    row_sq_diff_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, stream_>>>(da, db, row_len,
                                                                                   dout);
    launch_check("row_sq_diff_kernel");
    c.finish();
  }

 private:
  // True when kernels can dereference p: device, managed or registered
  // (pinned) host memory.  Ordinary pageable host memory is "unregistered".
  static bool device_accessible_slow(const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ||
           (attr.type == cudaMemoryTypeHost && attr.devicePointer == p);
  }

  // True when p lies in a block this backend allocated (alloc_buffer:
  // managed; prepare_weight: device): no driver call.  Caller holds mu_.
  bool owned(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = owned_.upper_bound(a);
    if (it == owned_.begin()) return false;
    --it;
    return a - it->first < it->second;
  }

  bool accessible(const void* p) const { return owned(p) || device_accessible_slow(p); }

  // Device mirrors of small read-only host inputs (the RMSNorm weight
  // vectors from the mmapped model, positions and token ids in
  // std::vector), keyed by host address and checked against a host copy of
  // the bytes on every use: a hit costs a memcmp, a changed content is
  // uploaded again into the same mirror.  So the result is exactly that of
  // staging every time.  Entries are only dropped at the start of a call
  // (every earlier call has synchronised, so no queued work reads them).
  struct Mirror {
    std::vector<unsigned char> host;  // the bytes the device copy holds
    void* dev = nullptr;
    size_t cap = 0;
  };
  static constexpr size_t kMirrorMaxBytes = size_t{64} << 10;  // per input
  static constexpr size_t kMirrorMaxTotal = size_t{64} << 20;  // all mirrors
  static constexpr size_t kMirrorMaxEntries = 4096;

  void drop_mirrors() {
    for (auto& [p, m] : mirrors_) cudaFree(m.dev);
    mirrors_.clear();
    mirror_bytes_ = 0;
  }

  // One backend call: holds the lock, makes host-memory arguments usable on
  // the device (staging copies, copied back for outputs), and ends with the
  // synchronisation that makes results visible to the host.  The staging
  // path exists because the runtime passes some small host arrays (norm
  // vectors from the mmapped model, token ids and positions in
  // std::vector); buffers from alloc_buffer() are used in place.
  class Call {
   public:
    explicit Call(CudaBackend& be) : be_(be), lock_(be.mu_) {
      be_.use_device();
      if (be_.mirror_bytes_ > kMirrorMaxTotal || be_.mirrors_.size() > kMirrorMaxEntries) {
        be_.drop_mirrors();
      }
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    ~Call() {
      // On an exception, wait for queued work before freeing its buffers.
      if (!finished_) cudaStreamSynchronize(be_.stream_);
      for (void* p : temps_) be_.release(p);
      for (void* p : retired_) cudaFree(p);
    }

    template <class T>
    const T* in(const T* p, int64_t n) {
      if (p == nullptr || n == 0 || be_.accessible(p)) return p;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      if (bytes <= kMirrorMaxBytes) return static_cast<const T*>(mirror(p, bytes));
      void* d = temp(bytes);
      cuda_check(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, be_.stream_),
                 "cudaMemcpyAsync (stage in)");
      return static_cast<const T*>(d);
    }

    // An output of n elements; with copy_in it is also an input (in place).
    template <class T>
    T* out(T* p, int64_t n, bool copy_in) {
      if (p == nullptr || n == 0 || be_.accessible(p)) return p;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      void* d = temp(bytes);
      if (copy_in) {
        cuda_check(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, be_.stream_),
                   "cudaMemcpyAsync (stage in)");
      }
      backs_.push_back({p, d, bytes});
      return static_cast<T*>(d);
    }

    // A gather source in host memory: its extent is 1 + the largest row
    // index, read from idx wherever it lives (cudaMemcpyDefault).
    const float* in_unknown_extent(const float* src, int64_t row_len, const int32_t* idx,
                                   int64_t n) {
      if (be_.accessible(src)) return src;
      std::vector<int32_t> ids(static_cast<size_t>(n));
      cuda_check(cudaMemcpyAsync(ids.data(), idx, static_cast<size_t>(n) * sizeof(int32_t),
                                 cudaMemcpyDefault, be_.stream_),
                 "cudaMemcpyAsync (indices)");
      cuda_check(cudaStreamSynchronize(be_.stream_), "cudaStreamSynchronize");
      const int64_t rows = 1 + *std::max_element(ids.begin(), ids.end());
      return in(src, rows * row_len);
    }

    // Copies staged outputs back and waits for everything queued.
    void finish() {
      for (const Back& b : backs_) {
        cuda_check(cudaMemcpyAsync(b.host, b.dev, b.bytes, cudaMemcpyDeviceToHost, be_.stream_),
                   "cudaMemcpyAsync (stage out)");
      }
      cuda_check(cudaStreamSynchronize(be_.stream_), "kernel execution");
      finished_ = true;
    }

   private:
    struct Back {
      void* host;
      const void* dev;
      size_t bytes;
    };

    // The device mirror of host input [p, p + bytes), uploaded when its
    // content differs from what the mirror holds.
    const void* mirror(const void* p, size_t bytes) {
      auto it = be_.mirrors_.find(p);
      if (it == be_.mirrors_.end()) it = be_.mirrors_.emplace(p, Mirror{}).first;
      Mirror& m = it->second;
      if (m.host.size() == bytes && std::memcmp(m.host.data(), p, bytes) == 0) return m.dev;
      m.host.clear();  // stays empty (a miss) if the upload below fails
      if (m.cap < bytes) {
        // An earlier argument of this call may use the old copy: free it
        // after the call's synchronisation.
        if (m.dev != nullptr) retired_.push_back(m.dev);
        be_.mirror_bytes_ -= m.cap;
        m.dev = nullptr;
        m.cap = 0;
        cuda_check(cudaMalloc(&m.dev, bytes), "cudaMalloc (mirror)");
        m.cap = bytes;
        be_.mirror_bytes_ += bytes;
      }
      cuda_check(cudaMemcpyAsync(m.dev, p, bytes, cudaMemcpyHostToDevice, be_.stream_),
                 "cudaMemcpyAsync (mirror)");
      m.host.assign(static_cast<const unsigned char*>(p),
                    static_cast<const unsigned char*>(p) + bytes);
      return m.dev;
    }

    void* temp(size_t bytes) {
      void* d = be_.acquire(bytes);
      temps_.push_back(d);
      return d;
    }

    CudaBackend& be_;
    std::lock_guard<std::mutex> lock_;
    std::vector<void*> temps_;
    std::vector<void*> retired_;
    std::vector<Back> backs_;
    bool finished_ = false;
  };

  // The device is per host thread in the CUDA runtime; a session may call
  // from any thread, so every entry point selects it.
  void use_device() { cuda_check(cudaSetDevice(device_), "cudaSetDevice"); }

  // Staging buffers: stream-ordered allocation (cheap after the pool warms
  // up) where the device supports memory pools, else plain cudaMalloc.
  void* acquire(size_t bytes) {
    void* d = nullptr;
    if (async_alloc_) {
      cuda_check(cudaMallocAsync(&d, bytes, stream_), "cudaMallocAsync (staging)");
    } else {
      cuda_check(cudaMalloc(&d, bytes), "cudaMalloc (staging)");
    }
    return d;
  }

  void release(void* d) {
    if (async_alloc_) {
      cudaFreeAsync(d, stream_);
    } else {
      cudaFree(d);
    }
  }

  // y = x W^T for many rows: W slice by slice to f32, then SGEMM.  In
  // column-major terms (cuBLAS), y^T[o][r] = sum_i W[o][i] x[r][i] is
  // C(n_out x n_rows, ld n_out) = A^T B with A = the weight slice seen as
  // an n_in x rows column-major matrix and B = x as n_in x n_rows.
  void gemm(const WeightView& w, const float* x, int64_t n_rows, float* y) {
    check(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
          "matmul: dimension too large for cuBLAS");
    const float one = 1.0f, zero = 0.0f;
    if (w.type == DType::F32) {
      cublas_check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n_out),
                               static_cast<int>(n_rows), static_cast<int>(w.n_in), &one,
                               static_cast<const float*>(w.data), static_cast<int>(w.n_in), x,
                               static_cast<int>(w.n_in), &zero, y, static_cast<int>(w.n_out)),
                   "cublasSgemm");
      return;
    }
    const int64_t row_floats = w.n_in;
    const int64_t slice = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmScratchBytes / sizeof(float)) / row_floats, 1, w.n_out);
    const size_t need = static_cast<size_t>(slice * row_floats) * sizeof(float);
    if (gemm_scratch_bytes_ < need) {
      // Every earlier use of the scratch has completed: each call ends with
      // a synchronisation.
      cuda_check(cudaFree(gemm_scratch_), "cudaFree (scratch)");
      gemm_scratch_ = nullptr;
      gemm_scratch_bytes_ = 0;
      cuda_check(cudaMalloc(&gemm_scratch_, need), "cudaMalloc (gemm scratch)");
      gemm_scratch_bytes_ = need;
    }
    float* wf = static_cast<float*>(gemm_scratch_);
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int64_t rows = std::min(slice, w.n_out - o0);
      // Same stream: the next slice's dequantization waits for this SGEMM.
      dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0, rows, wf,
                                   stream_);
      cublas_check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                               static_cast<int>(n_rows), static_cast<int>(w.n_in), &one, wf,
                               static_cast<int>(w.n_in), x, static_cast<int>(w.n_in), &zero, y + o0,
                               static_cast<int>(w.n_out)),
                   "cublasSgemm");
    }
  }

  const int device_;
  const int gemv_max_rows_;
  bool async_alloc_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::mutex mu_;
  std::vector<void*> weights_;
  std::map<uintptr_t, size_t> owned_;  // start -> bytes of alloc_buffer / prepare_weight blocks
  std::unordered_map<const void*, Mirror> mirrors_;
  size_t mirror_bytes_ = 0;
  void* gemm_scratch_ = nullptr;
  size_t gemm_scratch_bytes_ = 0;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& opts) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n) {
    fail(ErrorCode::kUnsupported, "cuda backend: no CUDA device " + std::to_string(device) + " (" +
                                      std::to_string(n) + " visible)");
  }
  return std::make_unique<CudaBackend>(device, opts);
}

}  // namespace cb
