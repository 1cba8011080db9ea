// Part of the CUDA backend (cuda_backend.cu, its only includer): the GEMV
// on quantized blocks (matmul of few rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_quant.cuh"

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
                            float* __restrict__ y, int split) {
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
      y[r * n_out + o] = s;
    }
  }
}

// Warps per output row for gemv_kernel: at least 2 steps each.
inline int gemv_split(int64_t steps) {
  int split = 1;
  while (split < kGemvWarps && steps / (2 * split) >= 2) split *= 2;
  return split;
}

// Kernel launchers, one class template per kernel so dispatch_type() can
// pick the instantiation for a weight type at run time.
template <DType T, bool kRound>
void launch_gemv(const WeightView& w, const float* x, int n_rows, float* y, cudaStream_t st) {
  const int64_t steps = is_float_type(T) ? (w.n_in + 31) / 32 : (w.n_in / 32 + 7) / 8;
  const int split = gemv_split(steps);
  const int64_t rows_per_block = kGemvWarps / split;
  const unsigned blocks = static_cast<unsigned>((w.n_out + rows_per_block - 1) / rows_per_block);
  gemv_kernel<T, kRound><<<blocks, 32 * kGemvWarps, 0, st>>>(static_cast<const uint8_t*>(w.data),
                                                             dtype_row_bytes(w.type, w.n_in),
                                                             w.n_in, w.n_out, x, n_rows, y, split);
  launch_check("gemv_kernel");
}

template <DType T>
struct LaunchGemv {
  static void run(const WeightView& w, const float* x, int n_rows, float* y, cudaStream_t st) {
    launch_gemv<T, false>(w, x, n_rows, y, st);
  }
};

template <DType T>
struct LaunchGemvBf16 {
  static void run(const WeightView& w, const float* x, int n_rows, float* y, cudaStream_t st) {
    launch_gemv<T, true>(w, x, n_rows, y, st);
  }
};

}  // namespace
}  // namespace cb
