// Part of the CUDA backend (cuda_backend.cu, its only includer): error
// checks, warp and block reductions, grid sizes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

// ------------------------------------------------------- warps, blocks --

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

// The largest of a float over the block (kRowThreads threads); every thread
// gets it.
__device__ float block_max(float v) {
  __shared__ float part[kRowThreads / 32];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float m = part[0];
#pragma unroll
  for (int i = 1; i < kRowThreads / 32; ++i) m = fmaxf(m, part[i]);
  __syncthreads();
  return m;
}

// ---------------------------------------------------- gated activations --

// One element of silu_mul / gelu_mul (Backend): the element-wise kernels and
// the GEMV that forms its input from a gate (ProductArgs) both take it from
// here, so either gives the same bits.
__device__ __forceinline__ float silu_mul_value(float g, float up) {
  return __fmul_rn(g / (1.0f + expf(-g)), up);
}

__device__ __forceinline__ float gelu_mul_value(float g, float up) {
  return g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g))) * up;
}

constexpr int kEltThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill any current GPU
// many times over, capped so the grid size stays far inside its limits.
unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kEltThreads - 1) / kEltThreads, 1, 65536));
}

}  // namespace
}  // namespace cb
