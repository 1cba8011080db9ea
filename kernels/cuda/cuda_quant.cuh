// Part of the CUDA backend (cuda_backend.cu, its only includer): decoding
// of every weight type, bit for bit as dequantize_row(), get_rows and the
// dequantization for the GEMMs, and dispatch on a weight type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/dtype.h"

namespace cb {
namespace {

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
//   Q5_0, Q5_1: the same nibble, with bit e of qh as its fifth bit
//   Q4_K: sub-block s = g % 8 lives in chunk s / 2 (low or high nibbles)
//   Q5_K: as Q4_K, with bit s of qh[e] as the fifth bit
//   Q2_K, Q3_K: see BlockQ2_K / BlockQ3_K (two scales per group)
//   Q6_K: see BlockQ6_K (s / 4 is the half, s % 4 the 32-element run)
//   IQ4_NL, IQ4_XS: the nibble as in Q4_0, a level of kIq4Levels; IQ4_XS's
//     sub-block s = g % 8 has its own 6-bit scale (see BlockIQ4_XS)
__constant__ int8_t kIq4LevelsDevice[16] = {CB_IQ4_LEVELS};

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
  } else if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
    using Block = std::conditional_t<T == DType::Q5_1, BlockQ5_1, BlockQ5_0>;
    const Block* b = reinterpret_cast<const Block*>(row) + g;
    const float d = h2f(b->d);
    const uint32_t h = static_cast<uint32_t>(b->qh[0]) | static_cast<uint32_t>(b->qh[1]) << 8 |
                       static_cast<uint32_t>(b->qh[2]) << 16 |
                       static_cast<uint32_t>(b->qh[3]) << 24;
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int e = e0 + l;
      const int q = ((b->qs[e % 16] >> (4 * (e / 16))) & 0x0F) | static_cast<int>((h >> e) & 1u)
                                                                     << 4;
      if constexpr (T == DType::Q5_1) {
        w[l] = __fadd_rn(__fmul_rn(static_cast<float>(q), d), h2f(b->m));
      } else {
        w[l] = __fmul_rn(static_cast<float>(q - 16), d);
      }
    }
  } else if constexpr (T == DType::Q8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + g;
    const float d = h2f(b->d);
#pragma unroll
    for (int l = 0; l < N; ++l) w[l] = __fmul_rn(static_cast<float>(b->qs[e0 + l]), d);
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    using Block = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
    const Block* b = reinterpret_cast<const Block*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    int sc, m;
    q4k_scale_min_dev(b->scales, s, &sc, &m);
    const float dd = __fmul_rn(h2f(b->d), static_cast<float>(sc));
    const float mm = __fmul_rn(h2f(b->dmin), static_cast<float>(m));
    const uint8_t* q = b->qs + 32 * (s / 2) + e0;
    const int shift = (s % 2) * 4;
#pragma unroll
    for (int l = 0; l < N; ++l) {
      int v = (q[l] >> shift) & 0x0F;
      if constexpr (T == DType::Q5_K) v |= ((b->qh[e0 + l] >> s) & 1) << 4;
      w[l] = __fsub_rn(__fmul_rn(dd, static_cast<float>(v)), mm);
    }
  } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    const int s = static_cast<int>(g % 8);
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int e = e0 + l, r = 2 * s + e / 16;
      if constexpr (T == DType::Q2_K) {
        const BlockQ2_K* b = reinterpret_cast<const BlockQ2_K*>(row) + g / 8;
        const int q = (b->qs[32 * (s / 4) + e] >> (2 * (s % 4))) & 3;
        const float dl = __fmul_rn(h2f(b->d), static_cast<float>(b->scales[r] & 0x0F));
        const float ml = __fmul_rn(h2f(b->dmin), static_cast<float>(b->scales[r] >> 4));
        w[l] = __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
      } else {
        const BlockQ3_K* b = reinterpret_cast<const BlockQ3_K*>(row) + g / 8;
        const int q = (b->qs[32 * (s / 4) + e] >> (2 * (s % 4))) & 3;
        const int high = (b->hmask[e] >> s) & 1;
        const int low4 = r < 8 ? b->scales[r] & 0x0F : b->scales[r - 8] >> 4;
        const int sc = low4 | ((b->scales[8 + r % 4] >> (2 * (r / 4))) & 3) << 4;
        const float dl = __fmul_rn(h2f(b->d), static_cast<float>(sc - 32));
        w[l] = __fmul_rn(dl, static_cast<float>(q - (high ? 0 : 4)));
      }
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
  } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
    const uint8_t* qs;
    float d;
    if constexpr (T == DType::IQ4_NL) {
      const BlockIQ4_NL* b = reinterpret_cast<const BlockIQ4_NL*>(row) + g;
      qs = b->qs;
      d = h2f(b->d);
    } else {
      const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(row) + g / 8;
      const int s = static_cast<int>(g % 8);
      const int ls = ((b->scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | ((b->scales_h >> (2 * s)) & 3)
                                                                          << 4;
      qs = b->qs + 16 * s;
      d = __fmul_rn(h2f(b->d), static_cast<float>(ls - 32));
    }
#pragma unroll
    for (int l = 0; l < N; ++l) {
      const int e = e0 + l;
      const int q = (qs[e % 16] >> (4 * (e / 16))) & 0x0F;
      w[l] = __fmul_rn(d, static_cast<float>(kIq4LevelsDevice[q]));
    }
  }
}

// ------------------------------------------------- dequantize / get_rows --

// out[r] = decoded weight row (ids ? ids[r] : row0 + r), for r < n.  One
// thread per 4 elements (per element for the float types), so that a warp
// writes 128 consecutive elements: one 32-element group per thread left
// each store instruction of a warp scattered over 32 lines, and the GEMMs'
// dequantization (every matmul of more than a few rows) ran at ~75 GB/s
// on an H200.  kVec: out is 16-byte aligned (vector stores).
__device__ __forceinline__ void store_as(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&v)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = u;
}

template <DType T, bool kVec, class Out>
__global__ void dequant_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                                    const int32_t* __restrict__ ids, int64_t row0, int64_t n,
                                    Out* __restrict__ out) {
  const int64_t per_row = is_float_type(T) ? n_in : n_in / 4;
  const int64_t total = n * per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / per_row, g = t % per_row;
    const int64_t src = ids != nullptr ? static_cast<int64_t>(ids[r]) : row0 + r;
    const uint8_t* row = w + static_cast<size_t>(src) * row_bytes;
    Out* o = out + r * n_in;
    if constexpr (is_float_type(T)) {
      store_as(o + g, load_elem<T>(row, g));
    } else {
      float v[4];
      decode_part<T, 4>(row, g / 8, 4 * static_cast<int>(g % 8), v);
      if constexpr (kVec) {
        store4(o + 4 * g, v);
      } else {
#pragma unroll
        for (int l = 0; l < 4; ++l) store_as(o + 4 * g + l, v[l]);
      }
    }
  }
}

template <DType T>
struct LaunchDequant {
  template <class Out>
  static void run(const WeightView& w, const int32_t* ids, int64_t row0, int64_t n, Out* out,
                  cudaStream_t st) {
    const int64_t per_row = is_float_type(T) ? w.n_in : w.n_in / 4;
    const bool vec = reinterpret_cast<uintptr_t>(out) % 16 == 0;
    auto* kernel = vec ? dequant_rows_kernel<T, true, Out> : dequant_rows_kernel<T, false, Out>;
    kernel<<<grid_for(n * per_row), kEltThreads, 0, st>>>(static_cast<const uint8_t*>(w.data),
                                                          dtype_row_bytes(w.type, w.n_in), w.n_in,
                                                          ids, row0, n, out);
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
    case DType::Q5_0:
      return Op<DType::Q5_0>::run(args...);
    case DType::Q5_1:
      return Op<DType::Q5_1>::run(args...);
    case DType::Q8_0:
      return Op<DType::Q8_0>::run(args...);
    case DType::Q4_K:
      return Op<DType::Q4_K>::run(args...);
    case DType::Q5_K:
      return Op<DType::Q5_K>::run(args...);
    case DType::Q2_K:
      return Op<DType::Q2_K>::run(args...);
    case DType::Q3_K:
      return Op<DType::Q3_K>::run(args...);
    case DType::Q6_K:
      return Op<DType::Q6_K>::run(args...);
    case DType::IQ4_NL:
      return Op<DType::IQ4_NL>::run(args...);
    case DType::IQ4_XS:
      return Op<DType::IQ4_XS>::run(args...);
  }
  fail(ErrorCode::kUnsupported, "cuda backend: unsupported weight type");
}

}  // namespace
}  // namespace cb
