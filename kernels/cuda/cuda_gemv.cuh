// Part of the CUDA backend (cuda_backend.cu, its only includer): the GEMV
// on quantized blocks (matmul of few rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_quant.cuh"
#include "platform/half.h"

namespace cb {
namespace {

// ---------------------------------------------------------------- GEMV --

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;  // warps per 256-thread GEMV block

// Bytes of 8 consecutive 32-element groups (one GEMV step): 8 blocks of the
// 32-element types, one super-block of the K-quants.
template <DType T>
constexpr int step_bytes() {
  switch (T) {
    case DType::Q4_0:
      return 8 * static_cast<int>(sizeof(BlockQ4_0));
    case DType::Q4_1:
      return 8 * static_cast<int>(sizeof(BlockQ4_1));
    case DType::Q5_0:
      return 8 * static_cast<int>(sizeof(BlockQ5_0));
    case DType::Q5_1:
      return 8 * static_cast<int>(sizeof(BlockQ5_1));
    case DType::Q8_0:
      return 8 * static_cast<int>(sizeof(BlockQ8_0));
    case DType::Q4_K:
      return static_cast<int>(sizeof(BlockQ4_K));
    case DType::Q5_K:
      return static_cast<int>(sizeof(BlockQ5_K));
    case DType::Q2_K:
      return static_cast<int>(sizeof(BlockQ2_K));
    case DType::Q3_K:
      return static_cast<int>(sizeof(BlockQ3_K));
    case DType::Q6_K:
      return static_cast<int>(sizeof(BlockQ6_K));
    case DType::IQ4_NL:
      return 8 * static_cast<int>(sizeof(BlockIQ4_NL));
    case DType::IQ4_XS:
      return static_cast<int>(sizeof(BlockIQ4_XS));
    default:
      return 0;
  }
}
constexpr int kGemvStageBytes = 8 * static_cast<int>(sizeof(BlockQ8_0));  // the largest step

// v, or v rounded to bf16 (to nearest even) and widened back (exact).
template <bool kRound>
__device__ __forceinline__ float round_if(float v) {
  if constexpr (kRound) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return v;
  }
}

// What gemv_k_kernel and gemv_k_q8_kernel multiply the weights by: x, or
// (kGated) act(x) * up formed as they load it, each element the bits
// silu_mul_kernel / gelu_mul_kernel would have stored (ProductArgs' gate).
// (Plain loads: __ldg here cost the default kernels registers, 58 to 70 for
// a Q4_K row a warp under ptxas for sm_90.)
template <bool kGated>
struct GemvInput {
  const float* x = nullptr;
  const float* up = nullptr;  // kGated: the up projection
  bool gelu = false;          // kGated: GELU (tanh), else SiLU
  // Elements [i, i + 4), i a multiple of 4 (x and up 16-byte aligned).
  __device__ __forceinline__ float4 load4(int64_t i) const {
    const float4 g = *reinterpret_cast<const float4*>(x + i);
    if constexpr (!kGated) {
      return g;
    } else {
      const float4 u = *reinterpret_cast<const float4*>(up + i);
      return gelu ? make_float4(gelu_mul_value(g.x, u.x), gelu_mul_value(g.y, u.y),
                                gelu_mul_value(g.z, u.z), gelu_mul_value(g.w, u.w))
                  : make_float4(silu_mul_value(g.x, u.x), silu_mul_value(g.y, u.y),
                                silu_mul_value(g.z, u.z), silu_mul_value(g.w, u.w));
    }
  }
  // The input from element `offset` on (the next activation row).
  GemvInput at(int64_t offset) const { return {x + offset, kGated ? up + offset : nullptr, gelu}; }
  bool aligned() const {
    return reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           (!kGated || reinterpret_cast<uintptr_t>(up) % 16 == 0);
  }
};

// y = v, or y + v when accumulating (ProductArgs::accumulate: the bits
// add_kernel gives for y + v).
__device__ __forceinline__ void store_output(float* y, float v, bool accumulate) {
  *y = accumulate ? __fadd_rn(*y, v) : v;
}

// `split` warps (a power of two dividing kGemvWarps) per output row o, each
// taking every split-th step of the row, their sums added in warp order
// through shared memory (deterministic).  Splitting long rows keeps enough
// loads in flight: with one warp per row, a 1536 x 8960 weight gives only
// 1536 warps, each waiting on 35 steps in turn.  Quantized types go in
// steps of 8 groups of 32
// elements: the warp first copies the step's blocks to shared memory with
// coalesced 16-bit loads (blocks are only 2-byte aligned, and reading them
// byte by byte from global memory made the kernel bound by load
// instructions), then each group is shared by 4 lanes of 8 elements, which
// decode their weights from shared memory and dot them with every
// activation row (x loads are whole 128-byte lines).  The weight is read
// once for all n_rows.  The accumulators are indexed only by unrolled
// constants (the `r < n_rows` guard), so they stay in registers.
// With kRound (matmul_q8), weights and activations are rounded to bf16
// before they are multiplied, as the many-row bf16 GEMM does, so that a row
// gets the same product whichever path its batch takes.
template <DType T, bool kRound>
__global__ void gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                            int64_t n_out, const float* __restrict__ x, int n_rows,
                            const float* __restrict__ bias, float* __restrict__ y, int split) {
  __shared__ __align__(16) uint16_t stage[kGemvWarps][kGemvStageBytes / 2];
  __shared__ float partial[kGemvWarps][kGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / split) + warp / split;
  const int part = warp % split;
  float acc[kGemvMaxRows] = {};
  const uint8_t* row = w + static_cast<size_t>(o) * row_bytes;
  if (o >= n_out) {
    // Nothing to add; stays for the block barrier below.
  } else if constexpr (is_float_type(T)) {
    for (int64_t i = lane + 32 * static_cast<int64_t>(part); i < n_in; i += 32 * split) {
      const float wv = round_if<kRound>(load_elem<T>(row, i));
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r < n_rows) acc[r] += wv * round_if<kRound>(x[r * n_in + i]);
      }
    }
  } else {
    constexpr int kStep = step_bytes<T>();
    const int64_t n_groups = n_in / 32;
    const int e0 = 8 * (lane % 4), gl = lane / 4;
    uint16_t* st = stage[warp];
    float wv[8];
    // The next step's blocks are loaded into registers while this step is
    // decoded, so a warp always has a step's loads in flight.
    constexpr int kPre = (kGemvStageBytes / 2 + 31) / 32;
    uint16_t pre[kPre];
    int halves = 0;
    auto fetch = [&](int64_t g) {
      // A partial last step only happens for the 32-element types (K-quant
      // rows are whole super-blocks), whose blocks are kStep / 8 bytes.
      const int n_g = static_cast<int>(min(static_cast<int64_t>(8), n_groups - g));
      halves = (n_g == 8 ? kStep : n_g * (kStep / 8)) / 2;  // Q6_K: 210 / 8 is not whole
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row + (g / 8) * kStep);
#pragma unroll
      for (int t = 0; t < kPre; ++t) {
        if (lane + 32 * t < halves) pre[t] = src[lane + 32 * t];
      }
    };
    const int64_t stride = 8 * static_cast<int64_t>(split);
    if (8 * static_cast<int64_t>(part) < n_groups) fetch(8 * static_cast<int64_t>(part));
    for (int64_t g0 = 8 * static_cast<int64_t>(part); g0 < n_groups; g0 += stride) {
      const int n_g = static_cast<int>(min(static_cast<int64_t>(8), n_groups - g0));
      const int step_halves = halves;
      __syncwarp();  // the previous step's reads of st are done
#pragma unroll
      for (int t = 0; t < kPre; ++t) {
        if (lane + 32 * t < step_halves) st[lane + 32 * t] = pre[t];
      }
      __syncwarp();
      if (g0 + stride < n_groups) fetch(g0 + stride);
      if (gl < n_g) {
        decode_part<T, 8>(reinterpret_cast<const uint8_t*>(st), gl, e0, wv);
#pragma unroll
        for (int l = 0; l < 8; ++l) wv[l] = round_if<kRound>(wv[l]);
#pragma unroll
        for (int r = 0; r < kGemvMaxRows; ++r) {
          if (r < n_rows) {
            const float* xr = x + r * n_in + 32 * (g0 + gl) + e0;
            float s = 0.0f;
#pragma unroll
            for (int l = 0; l < 8; ++l) s += wv[l] * round_if<kRound>(xr[l]);
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
      if (lane == 0) partial[warp][r] = s;
    }
  }
  __syncthreads();
  if (o >= n_out || part != 0 || lane != 0) return;
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < n_rows) {
      float s = partial[warp][r];
      for (int p = 1; p < split; ++p) s += partial[warp + p][r];
      y[r * n_out + o] = bias != nullptr ? __fadd_rn(s, bias[o]) : s;
    }
  }
}

// ------------------------------------------ GEMV on Q4_K and Q6_K rows --
//
// The K-quants of the usual Q4_K_M files, read straight from global memory
// in wide loads (no staging): the generic kernel above spends its time on
// shared-memory traffic and reached ~5 % of an H200's bandwidth on a 1.5B
// model's decode.  Each lane takes a fixed slice of a super-block (a
// "slice": its quants and scales in registers) and the matching slice of
// x.  A warp takes RW consecutive weight rows: with one activation row the
// x slice is loaded once for all of them, and their RW independent loads
// are in flight together.  x must be 16-byte aligned (float4 loads), which
// the launcher checks.  Same deterministic warp split and reduction as
// gemv_kernel.  Without kRound the dot products are factored per sub-block
// (dd * sum(q x) - mm * sum(x) for Q4_K, d * sc * sum(q x) for Q6_K): the
// weights are those of dequantize_row() to f32 rounding, only the order of
// the sums differs.  With kRound each weight is formed and rounded to bf16
// as the bf16 GEMM does.

// ------------------------------------ the int8 path of matmul_q8 (few rows) --
//
// Helpers that run on both sides, so that the host can check a lane's share
// of the integer products (tests/cuda/test_cuda_q8_lanes.cu) where no GPU is.

// c + the dot product of a's and b's four signed bytes (dp4a).
__host__ __device__ __forceinline__ int dot4_i8(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k) {
    c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * k)) *
         static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * k));
  }
  return c;
#endif
}

// Each byte of v less `bias`, modulo 256 (no borrow between bytes): biased
// quants (Q6_K's q - 32, Q4_0's q - 8, Q5_0's q - 16) as signed bytes.
__host__ __device__ __forceinline__ int minus_bytes(uint32_t v, uint32_t bias) {
#ifdef __CUDA_ARCH__
  return static_cast<int>(__vsub4(v, bias * 0x01010101u));
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= ((((v >> (8 * k)) & 0xFFu) - bias) & 0xFFu) << (8 * k);
  return static_cast<int>(r);
#endif
}

__host__ __device__ __forceinline__ float half_bits_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return h2f(h);
#else
  return f16_to_f32(h);
#endif
}

// a * b and a + b, rounded once each, never contracted into an FMA: the
// int8 path forms each block's term as the CPU's gemv_q8 does.
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Byte k of v as a float, minus (bias - 2^23): the byte put under 2^23's
// exponent makes the float 2^23 + byte, then one exact subtraction of bias
// (2^23 gives the byte itself, 2^23 + 32 the byte less 32).
template <int k>
__device__ __forceinline__ float byte_as_float(uint32_t v, float bias) {
  return __int_as_float(static_cast<int>(__byte_perm(v, 0x4B000000u, 0x7540u | k))) - bias;
}

// Q4_K: 8 lanes per super-block, 4 super-blocks per warp step.  Lane u of
// a super-block loads 16 bytes of qs (pair j = u / 2, half h = u % 2): the
// low nibbles are elements 16 h .. 16 h + 15 of sub-block 2 j, the high
// ones the same elements of sub-block 2 j + 1.
struct Q4kSlice {
  static constexpr int kUnit = 256;   // elements per super-block
  static constexpr int kPerStep = 4;  // super-blocks per warp step
  static constexpr int kElems = 32;   // x elements per lane
  uint4 q;
  uint32_t dm, s0, s1, s2;
  // Offset in the row of x element 0 of the slice; elements 16..31 are 32 on.
  __device__ static int64_t x_offset(int64_t b, int lane) {
    return 256 * b + 64 * ((lane % 8) / 2) + 16 * (lane % 2);
  }
  __device__ static int64_t x_gap(int t) { return t < 4 ? 0 : 16; }  // float4 t of 8
  __host__ __device__ void load(const uint8_t* row, int64_t b, int lane) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(row) + b;
    const int j = (lane % 8) / 2, h = lane % 2;
    q = *reinterpret_cast<const uint4*>(blk->qs + 32 * j + 16 * h);
    dm = *reinterpret_cast<const uint32_t*>(blk);
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(blk->scales);
    s0 = sw[0];
    s1 = sw[1];
    s2 = sw[2];
  }
  // The 6-bit scale and min of sub-block 2 j + t (q4k_scale_min on the
  // words: it is byte 2 (j % 2) + t of them, bytes s and s + 4 for s < 4,
  // s + 4 and s - 4 after).
  __host__ __device__ void scale_min(int j, int t, int& sc, int& m) const {
    const int sh = 16 * (j % 2) + 8 * t;
    if (j < 2) {
      sc = (s0 >> sh) & 63;
      m = (s1 >> sh) & 63;
    } else {
      sc = ((s2 >> sh) & 0x0F) | (((s0 >> sh) >> 6 & 3) << 4);
      m = ((s2 >> sh) >> 4 & 0x0F) | (((s1 >> sh) >> 6 & 3) << 4);
    }
  }
  // sum over the slice of w * x, x[0..32) the slice of x (bf16-rounded
  // with kRound) and sx its two sums of 16.
  template <bool kRound>
  __device__ float dot(const float (&x)[32], const float (&sx)[2], int lane) const {
    const int j = (lane % 8) / 2;
    const float d = h2f(static_cast<uint16_t>(dm)), dmin = h2f(static_cast<uint16_t>(dm >> 16));
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float total = 0.0f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      int sc, m;
      scale_min(j, t, sc, m);
      const float dd = __fmul_rn(d, static_cast<float>(sc));
      const float mm = __fmul_rn(dmin, static_cast<float>(m));
      float sqx = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t nib = t == 0 ? words[k] & 0x0F0F0F0Fu : (words[k] >> 4) & 0x0F0F0F0Fu;
        const float qe[4] = {byte_as_float<0>(nib, 8388608.0f), byte_as_float<1>(nib, 8388608.0f),
                             byte_as_float<2>(nib, 8388608.0f), byte_as_float<3>(nib, 8388608.0f)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float xv = x[16 * t + 4 * k + e];
          if constexpr (kRound) {
            sqx += round_if<true>(__fsub_rn(__fmul_rn(dd, qe[e]), mm)) * xv;
          } else {
            sqx = fmaf(qe[e], xv, sqx);
          }
        }
      }
      total += kRound ? sqx : dd * sqx - mm * sx[t];
    }
    return total;
  }

  // The int8 path.  Lane sums: v[t] = sum(q * xq) over the lane's 16
  // elements of sub-block 2 j + t, xq the super-block's 256 int8
  // activations.  Adding them over lane pairs (kQ8Group) gives each
  // sub-block's exact sum; the lane with h = t finishes sub-block 2 j + t.
  static constexpr int kQ8Sums = 2;
  static constexpr int kQ8Group = 2;
  __host__ __device__ void q8_sums(const int8_t* xq, int lane, int (&v)[kQ8Sums]) const {
    const int j = (lane % 8) / 2, h = lane % 2;
    const int* xl = reinterpret_cast<const int*>(xq + 64 * j + 16 * h);
    const int* xh = reinterpret_cast<const int*>(xq + 64 * j + 32 + 16 * h);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    int lo = 0, hi = 0;
    for (int k = 0; k < 4; ++k) {
      lo = dot4_i8(static_cast<int>(words[k] & 0x0F0F0F0Fu), xl[k], lo);
      hi = dot4_i8(static_cast<int>((words[k] >> 4) & 0x0F0F0F0Fu), xh[k], hi);
    }
    v[0] = lo;
    v[1] = hi;
  }
  // Which of the sums this lane finishes (-1: none), and that sum's 32-element
  // block in the super-block.
  __host__ __device__ static int q8_owned(int lane) {
    return lane % 2;
  }
  __host__ __device__ static int q8_block(int lane, int t) {
    return 2 * ((lane % 8) / 2) + t;
  }
  // acc += (d sc) dx isum - (dmin m) sx, as gemv_q8 (kernels/cpu) forms it.
  __host__ __device__ void q8_add(float& acc, int t, int isum, float dx, float sx, int lane) const {
    int sc, m;
    scale_min((lane % 8) / 2, t, sc, m);
    const float d = half_bits_to_float(static_cast<uint16_t>(dm));
    const float dmin = half_bits_to_float(static_cast<uint16_t>(dm >> 16));
    acc = add_rn(acc,
                 mul_rn(mul_rn(mul_rn(d, static_cast<float>(sc)), dx), static_cast<float>(isum)));
    acc = add_rn(acc, -mul_rn(mul_rn(dmin, static_cast<float>(m)), sx));
  }
};

// Q6_K: 16 lanes per super-block, 2 super-blocks per warp step.  Lane u of
// a super-block takes half n = u / 8 and l = l0 .. l0 + 3 (l0 = 4 (u % 8))
// of dequantize_row()'s loop: elements 128 n + 32 k + l for k = 0..3.
// Blocks are 210 bytes, so only 2-byte aligned: 16-bit loads.
__host__ __device__ __forceinline__ uint32_t load_u32_a2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

struct Q6kSlice {
  static constexpr int kUnit = 256;
  static constexpr int kPerStep = 2;
  static constexpr int kElems = 16;
  uint32_t a, bq, hq, sc01, sc23;
  uint16_t d;
  __device__ static int64_t x_offset(int64_t b, int lane) {
    const int u = lane % 16;
    return 256 * b + 128 * (u / 8) + 4 * (u % 8);
  }
  __device__ static int64_t x_gap(int t) { return 28 * t; }  // float4 t at 32 t
  __host__ __device__ void load(const uint8_t* row, int64_t b, int lane) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(row) + b;
    const int u = lane % 16, n = u / 8, l0 = 4 * (u % 8);
    a = load_u32_a2(blk->ql + 64 * n + l0);
    bq = load_u32_a2(blk->ql + 64 * n + 32 + l0);
    hq = load_u32_a2(blk->qh + 32 * n + l0);
    sc01 = load_u32_a2(reinterpret_cast<const uint8_t*>(blk->scales) + 8 * n);
    sc23 = load_u32_a2(reinterpret_cast<const uint8_t*>(blk->scales) + 8 * n + 4);
    d = blk->d;
  }
  template <bool kRound>
  __device__ float dot(const float (&x)[32], const float (&)[2], int lane) const {
    const int is = (lane % 8) / 4;  // l0 / 16
    const float df = h2f(d);
    // The four 6-bit quants of each run k, byte-parallel.
    const uint32_t qk[4] = {(a & 0x0F0F0F0Fu) | ((hq << 4) & 0x30303030u),
                            (bq & 0x0F0F0F0Fu) | ((hq << 2) & 0x30303030u),
                            ((a >> 4) & 0x0F0F0F0Fu) | (hq & 0x30303030u),
                            ((bq >> 4) & 0x0F0F0F0Fu) | ((hq >> 2) & 0x30303030u)};
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // scales[8n + 2k + is]: byte 2k + is of the 8 at 8n.
      const uint32_t sw = k < 2 ? sc01 : sc23;
      const int8_t sc = static_cast<int8_t>(sw >> (16 * (k % 2) + 8 * is));
      const float ds = __fmul_rn(df, static_cast<float>(sc));
      // q - 32 with the 2^23 trick: subtract 2^23 + 32 at once (exact).
      const float qe[4] = {byte_as_float<0>(qk[k], 8388640.0f), byte_as_float<1>(qk[k], 8388640.0f),
                           byte_as_float<2>(qk[k], 8388640.0f),
                           byte_as_float<3>(qk[k], 8388640.0f)};
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kRound) {
          s += round_if<true>(__fmul_rn(ds, qe[e])) * x[4 * k + e];
        } else {
          s = fmaf(qe[e], x[4 * k + e], s);
        }
      }
      total += kRound ? s : ds * s;
    }
    return total;
  }

  // The int8 path.  Lane sums: v[k] = the lane's 4 elements of run k (block
  // 4 n + k of the super-block, elements l0 .. l0 + 3) dotted with xq and
  // times their 8-bit scale, so that adding them over the 8 lanes of the
  // half (kQ8Group) gives gemv_q8's integer sum for the block, exactly.
  static constexpr int kQ8Sums = 4;
  static constexpr int kQ8Group = 8;
  __host__ __device__ void q8_sums(const int8_t* xq, int lane, int (&v)[kQ8Sums]) const {
    const int u = lane % 16, n = u / 8, l0 = 4 * (u % 8), is = (u % 8) / 4;
    const uint32_t qk[4] = {(a & 0x0F0F0F0Fu) | ((hq << 4) & 0x30303030u),
                            (bq & 0x0F0F0F0Fu) | ((hq << 2) & 0x30303030u),
                            ((a >> 4) & 0x0F0F0F0Fu) | (hq & 0x30303030u),
                            ((bq >> 4) & 0x0F0F0F0Fu) | ((hq >> 2) & 0x30303030u)};
    for (int k = 0; k < 4; ++k) {
      const uint32_t sw = k < 2 ? sc01 : sc23;
      const int sc = static_cast<int8_t>(sw >> (16 * (k % 2) + 8 * is));
      const int xv = *reinterpret_cast<const int*>(xq + 128 * n + 32 * k + l0);
      v[k] = sc * dot4_i8(minus_bytes(qk[k], 32), xv, 0);
    }
  }
  // Lanes 0-3 of each 8 finish blocks 4 n + 0..3.
  __host__ __device__ static int q8_owned(int lane) {
    return lane % 8 < 4 ? lane % 8 : -1;
  }
  __host__ __device__ static int q8_block(int lane, int k) {
    return 4 * ((lane % 16) / 8) + k;
  }
  // acc += (d dx) isum, as gemv_q8 forms it.
  __host__ __device__ void q8_add(float& acc, int, int isum, float dx, float, int) const {
    acc = add_rn(acc, mul_rn(mul_rn(half_bits_to_float(d), dx), static_cast<float>(isum)));
  }
};

// The int8 path's slice of the 32-element block types with an integer
// kernel on the CPU (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the types of Q4_K_M
// files whose rows are not whole super-blocks, and of Q4_0 / Q8_0 files):
// a lane takes a whole block (its 16-bit loads, blocks being 2-byte
// aligned), so no lanes share a block's sum.
template <DType T>
struct Block32Slice {
  static constexpr int kUnit = 32;
  static constexpr int kPerStep = 32;
  static constexpr int kQ8Sums = 1;
  static constexpr int kQ8Group = 1;
  static constexpr bool kQ8 = T == DType::Q8_0;
  static constexpr bool kQ5 = T == DType::Q5_0 || T == DType::Q5_1;
  static constexpr bool kMin = T == DType::Q4_1 || T == DType::Q5_1;  // x = q d + m
  static constexpr int kBlockBytes = 2 + (kMin ? 2 : 0) + (kQ5 ? 4 : 0) + (kQ8 ? 32 : 16);
  // Each element's quant less this (as gemv_q8 takes them): Q4_0's q - 8,
  // Q5_0's q - 16; the others unbiased.
  static constexpr uint32_t kBias = T == DType::Q4_0 ? 8 : T == DType::Q5_0 ? 16 : 0;
  uint32_t qw[kQ8 ? 8 : 4];  // the quant bytes
  uint32_t qh = 0;           // Q5: bit i is element i's fifth bit
  uint16_t d = 0, m = 0;
  __host__ __device__ void load(const uint8_t* row, int64_t b, int) {
    const uint8_t* blk = row + static_cast<size_t>(b) * kBlockBytes;
    d = *reinterpret_cast<const uint16_t*>(blk);
    if constexpr (kMin) m = *reinterpret_cast<const uint16_t*>(blk + 2);
    const uint8_t* at = blk + (kMin ? 4 : 2);
    if constexpr (kQ5) {
      qh = load_u32_a2(at);
      at += 4;
    }
    for (int k = 0; k < (kQ8 ? 8 : 4); ++k) qw[k] = load_u32_a2(at + 4 * k);
  }
  // Element i's fifth bit for elements i0 .. i0 + 3, at bit 4 of each byte.
  __host__ __device__ uint32_t fifth_bits(int i0) const {
    const uint32_t h = qh >> i0;
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
  }
  // v[0] = sum(q * xq) over the block (element j: the low nibble of byte j,
  // element j + 16 its high nibble; Q8_0's bytes in order).
  __host__ __device__ void q8_sums(const int8_t* xq, int, int (&v)[kQ8Sums]) const {
    const int* xi = reinterpret_cast<const int*>(xq);
    int sum = 0;
    if constexpr (kQ8) {
      for (int k = 0; k < 8; ++k) sum = dot4_i8(static_cast<int>(qw[k]), xi[k], sum);
    } else {
      for (int k = 0; k < 4; ++k) {
        uint32_t lo = qw[k] & 0x0F0F0F0Fu, hi = (qw[k] >> 4) & 0x0F0F0F0Fu;
        if constexpr (kQ5) {
          lo |= fifth_bits(4 * k);
          hi |= fifth_bits(16 + 4 * k);
        }
        sum = dot4_i8(minus_bytes(lo, kBias), xi[k], sum);
        sum = dot4_i8(minus_bytes(hi, kBias), xi[k + 4], sum);
      }
    }
    v[0] = sum;
  }
  __host__ __device__ static int q8_owned(int) { return 0; }
  __host__ __device__ static int q8_block(int, int) { return 0; }
  // acc += (d dx) isum (+ m sx), as gemv_q8 forms it.
  __host__ __device__ void q8_add(float& acc, int, int isum, float dx, float sx, int) const {
    acc = add_rn(acc, mul_rn(mul_rn(half_bits_to_float(d), dx), static_cast<float>(isum)));
    if constexpr (kMin) acc = add_rn(acc, mul_rn(half_bits_to_float(m), sx));
  }
};

// The int8 path's slice of weight type T.
template <DType T>
using Int8Slice =
    std::conditional_t<T == DType::Q4_K, Q4kSlice,
                       std::conditional_t<T == DType::Q6_K, Q6kSlice, Block32Slice<T>>>;

// Block `block` of the product (gemv_k_kernel's, or its part's in
// gemv_k_merged_kernel): R activation rows (at most), RW weight rows per
// warp; the outputs added to y when accumulating.
template <class S, int R, int RW, bool kRound, bool kGated>
__device__ __forceinline__ void gemv_k_block(const uint8_t* __restrict__ w, size_t row_bytes,
                                             int64_t n_in, int64_t n_out, GemvInput<kGated> x,
                                             int n_rows, const float* __restrict__ bias,
                                             float* __restrict__ y, bool accumulate, int split,
                                             unsigned block) {
  __shared__ float partial[kGemvWarps][R * RW];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (static_cast<int64_t>(block) * (kGemvWarps / split) + warp / split) * RW;
  const int part = warp % split;
  float acc[R][RW] = {};
  if (o0 < n_out) {
    const int64_t n_sb = n_in / 256, n_steps = (n_sb + S::kPerStep - 1) / S::kPerStep;
    const int per_sb = 32 / S::kPerStep;  // lanes per super-block
    for (int64_t step = part; step < n_steps; step += split) {
      const int64_t b = S::kPerStep * step + lane / per_sb;
      if (b >= n_sb) continue;
      S slice[RW];
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        if (o0 + i < n_out) slice[i].load(w + static_cast<size_t>(o0 + i) * row_bytes, b, lane);
      }
      const int64_t xo = S::x_offset(b, lane);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= n_rows) break;
        float xs[32];
        float sx[2] = {0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < S::kElems / 4; ++t) {
          const float4 v = x.load4(r * n_in + xo + 4 * t + S::x_gap(t));
          const float ve[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            xs[4 * t + e] = round_if<kRound>(ve[e]);
            sx[t / 4] += ve[e];
          }
        }
#pragma unroll
        for (int i = 0; i < RW; ++i) {
          if (o0 + i < n_out) acc[r][i] += slice[i].template dot<kRound>(xs, sx, lane);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      if (r < n_rows) {
        const float s = warp_sum(acc[r][i]);
        if (lane == 0) partial[warp][r * RW + i] = s;
      }
    }
  }
  __syncthreads();
  if (o0 >= n_out || part != 0 || lane >= RW || o0 + lane >= n_out) return;
    // Lane i writes row o0 + i.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r < n_rows) {
      float s = partial[warp][r * RW + lane];
      for (int p = 1; p < split; ++p) s += partial[warp + p][r * RW + lane];
      store_output(y + r * n_out + o0 + lane, bias != nullptr ? __fadd_rn(s, bias[o0 + lane]) : s,
                   accumulate);
    }
  }
}

template <class S, int R, int RW, bool kRound, bool kGated>
__global__ void __launch_bounds__(32 * kGemvWarps)
    gemv_k_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                  GemvInput<kGated> x, int n_rows, const float* __restrict__ bias,
                  float* __restrict__ y, bool accumulate, int split) {
  gemv_k_block<S, R, RW, kRound, kGated>(w, row_bytes, n_in, n_out, x, n_rows, bias, y, accumulate,
                                         split, blockIdx.x);
}

// Products of one input by several weights of one type and shape of launch
// (Backend::products: a layer's Q, K and V projections, its gate and up):
// one launch, each part's blocks after the previous part's, each block
// computing what it would in the part's own launch.
constexpr int kGemvMaxParts = 4;
struct GemvParts {
  int n = 0;
  const uint8_t* w[kGemvMaxParts] = {};
  int64_t n_out[kGemvMaxParts] = {};
  const float* bias[kGemvMaxParts] = {};
  float* y[kGemvMaxParts] = {};
  unsigned first_block[kGemvMaxParts] = {};  // part i's blocks start here
};

template <class S, int R, int RW>
__global__ void __launch_bounds__(32 * kGemvWarps)
    gemv_k_merged_kernel(GemvParts parts, size_t row_bytes, int64_t n_in, GemvInput<false> x,
                         int n_rows, int split) {
  int i = 0;
  while (i + 1 < parts.n && blockIdx.x >= parts.first_block[i + 1]) ++i;
  gemv_k_block<S, R, RW, false, false>(parts.w[i], row_bytes, n_in, parts.n_out[i], x, n_rows,
                                       parts.bias[i], parts.y[i], false, split,
                                       blockIdx.x - parts.first_block[i]);
}

// quantize_q8a's (kernels/cpu) scale d of a 32-element block whose largest
// magnitude is amax, and its factor id = 127 / amax (0 for a zero block).
__host__ __device__ __forceinline__ void q8_scales(float amax, float& d, float& id) {
#ifdef __CUDA_ARCH__
  d = __fdiv_rn(amax, 127.0f);
  id = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
#else
  d = amax / 127.0f;
  id = amax > 0.0f ? 127.0f / amax : 0.0f;
#endif
}

// v * id rounded to the nearest integer, ties to even, as quantize_q8a does.
__host__ __device__ __forceinline__ int q8_round(float v, float id) {
#ifdef __CUDA_ARCH__
  return __float2int_rn(__fmul_rn(v, id));
#else
  return static_cast<int>(std::nearbyint(v * id));
#endif
}

// x[0, n) quantized into shared memory as quantize_q8a writes it, bit for
// bit: qs[0, n), d and s[0, n / 32).  Every thread of the block takes part:
// 8 threads a 32-element block, 4 elements each.  n is a multiple of 32
// and x 16-byte aligned.
template <bool kGated>
__device__ void quantize_q8_shared(const GemvInput<kGated>& x, int64_t n, int8_t* qs, float* d,
                                   float* s) {
  constexpr int kGroups = 32 * kGemvWarps / 8;
  const int64_t n_blocks = n / 32;
  const int g = threadIdx.x / 8, i = threadIdx.x % 8;
  // Every lane goes round the loop alike: the shuffles need the whole warp.
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kGroups) {
    const int64_t b = b0 + g;
    const bool in = b < n_blocks;
    const float4 v = in ? x.load4(4 * (8 * b + i)) : make_float4(0, 0, 0, 0);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float db, id;
    q8_scales(amax, db, id);
    const int q0 = q8_round(v.x, id), q1 = q8_round(v.y, id), q2 = q8_round(v.z, id),
              q3 = q8_round(v.w, id);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (in) {
      reinterpret_cast<uint32_t*>(qs)[8 * b + i] =
          (static_cast<uint32_t>(q0) & 0xFFu) | ((static_cast<uint32_t>(q1) & 0xFFu) << 8) |
          ((static_cast<uint32_t>(q2) & 0xFFu) << 16) | (static_cast<uint32_t>(q3) << 24);
      if (i == 0) {
        d[b] = db;
        s[b] = __fmul_rn(db, static_cast<float>(sum));
      }
    }
  }
}

// The int8 path of matmul_q8 for one activation row of Q4_K or Q6_K
// weights: gemv_q8's semantics (kernels/cpu/reference_ops.h).  Each block
// first quantizes x into shared memory as quantize_q8a does; then each lane
// takes its slice of a super-block as in gemv_k_kernel, dots its quants
// with the int8 activations four at a time (dp4a), and the lanes that share
// a 32-element block add their integer sums (shuffles), so each block's
// term is gemv_q8's to the bit and only the order in which the terms are
// added differs.  Against the f32 path: a quarter of the activation bytes
// read per weight and a quarter of the multiplies.  A warp takes RW weight
// rows and has 4 slices' loads in flight (4 / RW steps) before it computes;
// its first ones are issued before the block quantizes x.
template <class S, int RW, bool kGated>
__global__ void __launch_bounds__(32 * kGemvWarps)
    gemv_k_q8_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                     GemvInput<kGated> x, const float* __restrict__ bias, float* __restrict__ y,
                     bool accumulate, int split) {
  extern __shared__ __align__(16) unsigned char q8x[];
  __shared__ float partial[kGemvWarps][RW];
  int8_t* xq = reinterpret_cast<int8_t*>(q8x);
  float* xd = reinterpret_cast<float*>(q8x + n_in);
  float* xs = xd + n_in / 32;
  constexpr int kSteps = 4 / RW;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * (kGemvWarps / split) + warp / split) * RW;
  const int part = warp % split;
  const int64_t n_sb = n_in / S::kUnit, n_steps = (n_sb + S::kPerStep - 1) / S::kPerStep;
  const int per_sb = 32 / S::kPerStep;  // lanes per unit
  // The warp's next kSteps steps (those from `first`, split apart): their
  // units (super-blocks, or blocks of 32; n_sb: none) and slices.
  S slice[kSteps][RW] = {};
  int64_t sb[kSteps];
  auto load_steps = [&](int64_t first) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int64_t step = first + static_cast<int64_t>(u) * split;
      sb[u] = step < n_steps ? S::kPerStep * step + lane / per_sb : n_sb;
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        if (sb[u] < n_sb && o0 + i < n_out)
          slice[u][i].load(w + static_cast<size_t>(o0 + i) * row_bytes, sb[u], lane);
      }
    }
  };
  // The first steps' weights are on their way while the block quantizes x.
  if (o0 < n_out) load_steps(part);
  quantize_q8_shared(x, n_in, xq, xd, xs);
  __syncthreads();
  float acc[RW] = {};
  for (int64_t first = part; o0 < n_out && first < n_steps;) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const bool valid = sb[u] < n_sb && o0 + i < n_out;
        int v[S::kQ8Sums] = {};
        if (valid) slice[u][i].q8_sums(xq + S::kUnit * sb[u], lane, v);
#pragma unroll
        for (int t = 0; t < S::kQ8Sums; ++t) {
#pragma unroll
          for (int o = 1; o < S::kQ8Group; o <<= 1) v[t] += __shfl_xor_sync(0xffffffffu, v[t], o);
        }
        const int own = S::q8_owned(lane);
        int isum = 0;
#pragma unroll
        for (int t = 0; t < S::kQ8Sums; ++t) isum = t == own ? v[t] : isum;
        if (valid && own >= 0) {
          const int64_t blk = S::kUnit / 32 * sb[u] + S::q8_block(lane, own);
          slice[u][i].q8_add(acc[i], own, isum, xd[blk], xs[blk], lane);
        }
      }
    }
    first += static_cast<int64_t>(kSteps) * split;
    if (first < n_steps) load_steps(first);
  }
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const float s = warp_sum(acc[i]);
    if (lane == 0) partial[warp][i] = s;
  }
  __syncthreads();
  if (o0 >= n_out || part != 0 || lane >= RW || o0 + lane >= n_out) return;
  // Lane i writes row o0 + i.
  float s = partial[warp][lane];
  for (int p = 1; p < split; ++p) s += partial[warp + p][lane];
  store_output(y + o0 + lane, bias != nullptr ? __fadd_rn(s, bias[o0 + lane]) : s, accumulate);
}

// Warps per output row for gemv_kernel: at least 2 steps each.
inline int gemv_split(int64_t steps) {
  int split = 1;
  while (split < kGemvWarps && steps / (2 * split) >= 2) split *= 2;
  return split;
}

// Kernel launchers, one class template per kernel so dispatch_type() can
// pick the instantiation for a weight type at run time.
// gemv_k_kernel's launch shape: activation rows (kGemvMaxRows, or 1),
// weight rows a warp, and the fewest warps a weight row.
struct GemvKShape {
  int rows, rows_per_warp, min_split;
  bool operator==(const GemvKShape& o) const {  // CUDA's C++17: no defaulted comparison
    return rows == o.rows && rows_per_warp == o.rows_per_warp && min_split == o.min_split;
  }
};
inline GemvKShape gemv_k_shape(int n_rows, int64_t n_out) {
  // One activation row (decode): several weight rows per warp share its x
  // loads where there are rows enough to keep every SM busy (measured on an
  // H200: 286 tok/s against 275 with one row a warp and more warps a row).
  if (n_rows > 1) return {kGemvMaxRows, 1, 1};
  if (n_out >= 8192) return {1, 4, 1};
  if (n_out >= 4096) return {1, 2, 1};
  // Fewer rows leave most of the GPU idle: each row's steps go to two
  // warps, so a warp waits on one load instead of two in turn (a
  // 1536 x 1536 Q4_K weight: 5.9 against 7.0 us under ncu on an H100).
  return {1, 1, 2};
}

template <DType T>
using GemvKSlice = std::conditional_t<T == DType::Q4_K, Q4kSlice, Q6kSlice>;

// Warps a weight row of n_in elements gets at the fewest min_split.
template <DType T>
int gemv_k_split(int64_t n_in, int min_split) {
  using S = GemvKSlice<T>;
  const int64_t steps = (n_in / 256 + S::kPerStep - 1) / S::kPerStep;
  return std::max(gemv_split(steps), static_cast<int>(std::min<int64_t>(min_split, steps)));
}

// The Q4_K / Q6_K kernel for R activation rows at most, RW weight rows per
// warp, and at least min_split warps per weight row where the row has that
// many steps.
template <DType T, bool kRound, int R, int RW, bool kGated>
void launch_gemv_k(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias,
                   float* y, bool accumulate, cudaStream_t st, int min_split) {
  const int split = gemv_k_split<T>(w.n_in, min_split);
  const int64_t rows_per_block = RW * (kGemvWarps / split);
  const unsigned blocks = static_cast<unsigned>((w.n_out + rows_per_block - 1) / rows_per_block);
  gemv_k_kernel<GemvKSlice<T>, R, RW, kRound, kGated><<<blocks, 32 * kGemvWarps, 0, st>>>(
      static_cast<const uint8_t*>(w.data), dtype_row_bytes(w.type, w.n_in), w.n_in, w.n_out, x,
      n_rows, bias, y, accumulate, split);
  launch_check("gemv_k_kernel");
}

// Whether gemv_k_kernel takes weight w with input x: Q4_K or Q6_K, x (and
// a Q4_K weight, whose 144-byte blocks keep rows 16-byte aligned) aligned
// for its float4 loads.
template <bool kGated>
bool gemv_k_applies(const WeightView& w, const GemvInput<kGated>& x) {
  return x.aligned() && (w.type == DType::Q6_K ||
                         (w.type == DType::Q4_K && reinterpret_cast<uintptr_t>(w.data) % 16 == 0));
}

// gemv_k_kernel for a Q4_K or Q6_K weight (T) in its launch shape.
template <DType T, bool kRound, bool kGated>
void launch_gemv_k_rows(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias,
                        float* y, bool accumulate, cudaStream_t st) {
  const GemvKShape sh = gemv_k_shape(n_rows, w.n_out);
  if (sh.rows > 1) {
    return launch_gemv_k<T, kRound, kGemvMaxRows, 1>(w, x, n_rows, bias, y, accumulate, st,
                                                     sh.min_split);
  }
  if (sh.rows_per_warp == 4) {
    return launch_gemv_k<T, kRound, 1, 4>(w, x, n_rows, bias, y, accumulate, st, sh.min_split);
  }
  if (sh.rows_per_warp == 2) {
    return launch_gemv_k<T, kRound, 1, 2>(w, x, n_rows, bias, y, accumulate, st, sh.min_split);
  }
  return launch_gemv_k<T, kRound, 1, 1>(w, x, n_rows, bias, y, accumulate, st, sh.min_split);
}

// gemv_k_merged_kernel over `parts` (their weights, n_outs, biases and
// outputs set) of type T, all in launch shape sh: the blocks each part
// would have in its own launch, one after another.
template <DType T, int R, int RW>
void launch_gemv_k_merged_as(GemvParts parts, int64_t n_in, GemvInput<false> x, int n_rows,
                             int min_split, cudaStream_t st) {
  const int split = gemv_k_split<T>(n_in, min_split);
  const int64_t rows_per_block = RW * (kGemvWarps / split);
  unsigned blocks = 0;
  for (int i = 0; i < parts.n; ++i) {
    parts.first_block[i] = blocks;
    blocks += static_cast<unsigned>((parts.n_out[i] + rows_per_block - 1) / rows_per_block);
  }
  gemv_k_merged_kernel<GemvKSlice<T>, R, RW>
      <<<blocks, 32 * kGemvWarps, 0, st>>>(parts, dtype_row_bytes(T, n_in), n_in, x, n_rows, split);
  launch_check("gemv_k_merged_kernel");
}

template <DType T>
void launch_gemv_k_merged(const GemvParts& parts, int64_t n_in, GemvInput<false> x, int n_rows,
                          GemvKShape sh, cudaStream_t st) {
  if (sh.rows > 1) {
    return launch_gemv_k_merged_as<T, kGemvMaxRows, 1>(parts, n_in, x, n_rows, sh.min_split, st);
  }
  if (sh.rows_per_warp == 4) {
    return launch_gemv_k_merged_as<T, 1, 4>(parts, n_in, x, n_rows, sh.min_split, st);
  }
  if (sh.rows_per_warp == 2) {
    return launch_gemv_k_merged_as<T, 1, 2>(parts, n_in, x, n_rows, sh.min_split, st);
  }
  return launch_gemv_k_merged_as<T, 1, 1>(parts, n_in, x, n_rows, sh.min_split, st);
}

template <DType T, bool kRound>
void launch_gemv(const WeightView& w, const float* x, int n_rows, const float* bias, float* y,
                 cudaStream_t st) {
  if constexpr (T == DType::Q4_K || T == DType::Q6_K) {
    const GemvInput<false> in{x};
    if (gemv_k_applies(w, in))
      return launch_gemv_k_rows<T, kRound>(w, in, n_rows, bias, y, false, st);
  }
  const int64_t steps = is_float_type(T) ? (w.n_in + 31) / 32 : (w.n_in / 32 + 7) / 8;
  const int split = gemv_split(steps);
  const int64_t rows_per_block = kGemvWarps / split;
  const unsigned blocks = static_cast<unsigned>((w.n_out + rows_per_block - 1) / rows_per_block);
  gemv_kernel<T, kRound><<<blocks, 32 * kGemvWarps, 0, st>>>(
      static_cast<const uint8_t*>(w.data), dtype_row_bytes(w.type, w.n_in), w.n_in, w.n_out, x,
      n_rows, bias, y, split);
  launch_check("gemv_kernel");
}

// Shared memory of the int8 path: the quantized activations (n_in bytes)
// and two floats a 32-element block.  With the kernel's static shared
// memory it stays within the 48 KiB a block gets without opting into more
// (n_in up to about 37,000).
constexpr size_t kGemvQ8MaxShared = size_t{46} << 10;
inline size_t gemv_q8_shared_bytes(int64_t n_in) {
  return static_cast<size_t>(n_in) + 8 * static_cast<size_t>(n_in / 32);
}

template <DType T, int RW, bool kGated>
void launch_gemv_k_q8(const WeightView& w, GemvInput<kGated> x, const float* bias, float* y,
                      bool accumulate, cudaStream_t st, int split) {
  using S = Int8Slice<T>;
  const int64_t rows_per_block = RW * (kGemvWarps / split);
  const unsigned blocks = static_cast<unsigned>((w.n_out + rows_per_block - 1) / rows_per_block);
  gemv_k_q8_kernel<S, RW, kGated><<<blocks, 32 * kGemvWarps, gemv_q8_shared_bytes(w.n_in), st>>>(
      static_cast<const uint8_t*>(w.data), dtype_row_bytes(w.type, w.n_in), w.n_in, w.n_out, x,
      bias, y, accumulate, split);
  launch_check("gemv_k_q8_kernel");
}

// How gemv_k_q8_kernel is launched: weight rows a warp (1, 2 or 4) and
// warps a row (1, 2 or 4); 0 lets launch_gemv_int8 choose.
struct Int8GemvShape {
  int rows_per_warp = 0;
  int warps_per_row = 0;
};

// matmul_q8's int8 GEMV, row by row, for a weight of type T.  Each block
// quantizes the whole row, so fewer, larger blocks waste less: by default
// two weight rows a warp where rows are many, else one row over two warps
// where the row has two steps or more; `shape` overrides either (for
// measuring).
template <DType T, bool kGated>
void launch_gemv_int8_rows(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias,
                           float* y, bool accumulate, cudaStream_t st, Int8GemvShape shape) {
  using S = Int8Slice<T>;
  const int64_t steps = (w.n_in / S::kUnit + S::kPerStep - 1) / S::kPerStep;
  const int rw = shape.rows_per_warp > 0 ? shape.rows_per_warp : w.n_out >= 4096 ? 2 : 1;
  const int split = shape.warps_per_row > 0        ? shape.warps_per_row
                    : w.n_out >= 4096 || steps < 2 ? 1
                                                   : 2;
  for (int r = 0; r < n_rows; ++r) {
    const GemvInput<kGated> xr = x.at(static_cast<int64_t>(r) * w.n_in);
    float* yr = y + static_cast<int64_t>(r) * w.n_out;
    if (rw == 4) {
      launch_gemv_k_q8<T, 4>(w, xr, bias, yr, accumulate, st, split);
    } else if (rw == 2) {
      launch_gemv_k_q8<T, 2>(w, xr, bias, yr, accumulate, st, split);
    } else {
      launch_gemv_k_q8<T, 1>(w, xr, bias, yr, accumulate, st, split);
    }
  }
}

// The weight types with an int8 slice.
constexpr bool has_int8_slice(DType t) {
  return t == DType::Q4_K || t == DType::Q6_K || t == DType::Q4_0 || t == DType::Q4_1 ||
         t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
}
template <DType T>
constexpr bool kHasInt8Slice = has_int8_slice(T);

template <DType T>
struct LaunchGemvInt8 {
  template <bool kGated>
  static void run(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias, float* y,
                  bool accumulate, cudaStream_t st, Int8GemvShape shape, bool* launched) {
    if constexpr (kHasInt8Slice<T>) {
      launch_gemv_int8_rows<T>(w, x, n_rows, bias, y, accumulate, st, shape);
      *launched = true;
    }
  }
};

// matmul_q8's int8 GEMV where it applies: Q4_K, Q6_K, Q4_0, Q4_1, Q5_0,
// Q5_1 and Q8_0 weights (Q4_K weights 16-byte aligned), x 16-byte aligned,
// the quantized row within kGemvQ8MaxShared.  False where it does not (the
// caller takes another path).  Its outputs are added to y when accumulating.
template <bool kGated>
bool launch_gemv_int8(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias,
                      float* y, bool accumulate, cudaStream_t st, Int8GemvShape shape = {}) {
  if (gemv_q8_shared_bytes(w.n_in) > kGemvQ8MaxShared) return false;
  if (!x.aligned()) return false;
  if (w.type == DType::Q4_K && reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
  bool launched = false;
  dispatch_type<LaunchGemvInt8>(w.type, w, x, n_rows, bias, y, accumulate, st, shape, &launched);
  return launched;
}

// Backend::product's GEMV with its gate and accumulation folded in, for the
// weights gemv_k_kernel takes (gemv_k_applies); false for others.
template <bool kGated>
bool launch_gemv_k_fused(const WeightView& w, GemvInput<kGated> x, int n_rows, const float* bias,
                         float* y, bool accumulate, cudaStream_t st) {
  if (!gemv_k_applies(w, x)) return false;
  if (w.type == DType::Q4_K) {
    launch_gemv_k_rows<DType::Q4_K, false>(w, x, n_rows, bias, y, accumulate, st);
  } else {
    launch_gemv_k_rows<DType::Q6_K, false>(w, x, n_rows, bias, y, accumulate, st);
  }
  return true;
}

template <DType T>
struct LaunchGemv {
  static void run(const WeightView& w, const float* x, int n_rows, const float* bias, float* y,
                  cudaStream_t st) {
    launch_gemv<T, false>(w, x, n_rows, bias, y, st);
  }
};

template <DType T>
struct LaunchGemvBf16 {
  static void run(const WeightView& w, const float* x, int n_rows, const float* bias, float* y,
                  cudaStream_t st) {
    launch_gemv<T, true>(w, x, n_rows, bias, y, st);
  }
};

}  // namespace
}  // namespace cb
