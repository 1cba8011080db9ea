// Part of the CUDA backend (cuda_backend.cu, its only includer): kernels
// over rows and elements (norms, RoPE, activations, gathers, top-k keys).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace cb {
namespace {

// --------------------------------------------------------- row kernels --

// Activations in bf16 for the tensor-core GEMM (to nearest even).  bf16
// keeps f32's exponent range: activation outliers in the thousands need no
// scaling, as they would in f16 (largest 65504).
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n,
                               __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
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
// the same rotation for every head of the row.  Each block first writes the
// n_pairs inverse frequencies (f64 pow, the costliest step) to shared
// memory, so a thread pays one f64 sincos rather than a pow, a sin and a
// cos (a blend re-rotates every reused key of every layer).
__global__ void rope_kernel(float* x, const int32_t* __restrict__ pos, int64_t n_rows,
                            int64_t n_heads, int64_t head_dim, int64_t rot_dim, float freq_base,
                            const float* __restrict__ freq_factors) {
  extern __shared__ double inv_freq[];
  const int64_t n_pairs = rot_dim / 2;
  for (int64_t i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    double f = pow(static_cast<double>(freq_base),
                   -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    if (freq_factors != nullptr) f /= static_cast<double>(freq_factors[i]);
    inv_freq[i] = f;
  }
  __syncthreads();
  const int64_t total = n_rows * n_pairs;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / n_pairs, i = t % n_pairs;
    double sd, cd;
    sincos(static_cast<double>(pos[r]) * inv_freq[i], &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim + 2 * i;
      const float a = v[0], b = v[1];
      v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      v[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
  }
}

// ------------------------------------------------------ element kernels --

#define CB_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    out[i] = silu_mul_value(gate[i], up[i]);
  }
}

// No __restrict__: out may alias a or b.
__global__ void gelu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    out[i] = gelu_mul_value(gate[i], up[i]);
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  CB_GRID_STRIDE(i, n) {
    x[i] *= s;
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    out[i] = a[i] + b[i];
  }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ bias, int64_t n, int64_t dim) {
  CB_GRID_STRIDE(i, n) {
    x[i] = x[i] + bias[i % dim];
  }
}

// Backend::segment_means: one thread per (segment, column), the column's
// pairwise halving in place in x, in the contract's order.
__global__ void segment_means_kernel(float* x, int64_t row_len, const int32_t* __restrict__ seg,
                                     int64_t n_seg, float* __restrict__ out) {
  CB_GRID_STRIDE(t, n_seg * row_len) {
    const int64_t s = t / row_len, j = t % row_len;
    float* col = x + static_cast<int64_t>(seg[s]) * row_len + j;
    const int64_t n0 = seg[s + 1] - seg[s];
    for (int64_t n = n0; n > 1;) {
      const int64_t h = n / 2;
      for (int64_t i = 0; i < h; ++i)
        col[i * row_len] = col[i * row_len] + col[(i + n - h) * row_len];
      n -= h;
    }
    out[t] = __fmul_rn(col[0], __frcp_rn(static_cast<float>(n0)));
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

// The rows of an f16 KV cache: rounded to nearest, ties to even (the bits
// of cb::f32_to_f16), and widened back exactly.
__global__ void scatter_rows_f16_kernel(const float* __restrict__ src, int64_t row_len,
                                        const int32_t* __restrict__ idx, int64_t n,
                                        uint16_t* __restrict__ dst) {
  CB_GRID_STRIDE(t, n * row_len) {
    const int64_t r = t / row_len, j = t % row_len;
    dst[static_cast<int64_t>(idx[r]) * row_len + j] = __half_as_ushort(__float2half_rn(src[t]));
  }
}

__global__ void gather_rows_f16_kernel(const uint16_t* __restrict__ src, int64_t row_len,
                                       const int32_t* __restrict__ idx, int64_t n,
                                       float* __restrict__ dst) {
  CB_GRID_STRIDE(t, n * row_len) {
    const int64_t r = t / row_len, j = t % row_len;
    dst[t] = __half2float(__ushort_as_half(src[static_cast<int64_t>(idx[r]) * row_len + j]));
  }
}

// top_k, step 1: radix-sort keys whose ascending order is the order of
// top_k_indices (larger value first).  The float's bits are made
// order-preserving as an unsigned number (negative: every bit flipped;
// positive: sign bit set) and then complemented.  -0 becomes +0 first,
// because the reference compares with == and so treats them as equal.  A
// stable ascending sort of (key, index) then puts equal values in index
// order: ties go to the lower index.
__global__ void topk_keys_kernel(const float* __restrict__ v, int64_t n,
                                 uint32_t* __restrict__ keys, int32_t* __restrict__ idx) {
  CB_GRID_STRIDE(i, n) {
    // Zero by its bits: a compare would also match subnormals if the code
    // were ever built to flush them.
    uint32_t u = __float_as_uint(v[i]);
    if ((u << 1) == 0) u = 0;
    u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
    keys[i] = ~u;
    idx[i] = static_cast<int32_t>(i);
  }
}

#undef CB_GRID_STRIDE

}  // namespace
}  // namespace cb
