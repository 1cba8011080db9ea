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
//    f32 in a scratch buffer and call cuBLAS SGEMM: the exact path, held to
//    a float64 reference at a relative L2 of 1e-3.  matmul_q8 (the rounded
//    product the runtime uses by default, as for the CPU's int8
//    activations) rounds weights and activations to bf16 on both paths and
//    runs its GEMM on tensor cores.
//  - attention: few query rows (decode) run a kernel, one block per (row,
//    head); many rows go through cuBLAS SGEMM per head and a softmax kernel.
//  - rmsnorm and row_sq_diff accumulate in f64 like the reference; rope
//    computes its angles in f64 and rounds once; the attention kernel is an
//    online (one pass) softmax, so it matches the two-pass reference to
//    rounding.
//
// Streams and synchronisation (docs/CUDA.md "Synchronisation"): every
// calling thread gets its own stream (the KV loader thread's uploads and RoPE
// run beside the compute thread's work).  Outside a batch an op waits for its
// stream before returning, because the runtime's host code may read results
// right after a call; between begin_batch() and end_batch() ops only enqueue,
// except those with an output in host memory.  Host inputs are copied into
// page-locked memory before their asynchronous upload, so the caller may
// reuse them as soon as the op returns, as the Backend contract says.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_plugin.h"
#include "platform/error.h"

namespace cb {

// A CUDA event owned by a CudaMark (cuda_backend.h).
struct CudaEvent {
  cudaEvent_t ev = nullptr;
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

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

// ---------------------------------------------------------------- GEMV --

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;  // warps per 256-thread GEMV block

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

// ------------------------------------------------- dequantize / get_rows --

// out[r] = decoded weight row (ids ? ids[r] : row0 + r), for r < n.  One
// thread per 32-element group (per element for the float types).
__device__ __forceinline__ void store_as(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <DType T, class Out>
__global__ void dequant_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                                    const int32_t* __restrict__ ids, int64_t row0, int64_t n,
                                    Out* __restrict__ out) {
  const int64_t per_row = is_float_type(T) ? n_in : n_in / 32;
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
      float v[32];
      decode_part<T, 32>(row, g, 0, v);
#pragma unroll
      for (int l = 0; l < 32; ++l) store_as(o + 32 * g + l, v[l]);
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
// the same rotation for every head of the row.
__global__ void rope_kernel(float* x, const int32_t* __restrict__ pos, int64_t n_rows,
                            int64_t n_heads, int64_t head_dim, int64_t rot_dim, float freq_base,
                            const float* __restrict__ freq_factors) {
  const int64_t n_pairs = rot_dim / 2;
  const int64_t total = n_rows * n_pairs;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / n_pairs, i = t % n_pairs;
    double inv_freq = pow(static_cast<double>(freq_base),
                          -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    if (freq_factors != nullptr) inv_freq /= static_cast<double>(freq_factors[i]);
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
// attention() with at least this many query rows goes through cuBLAS
// (CudaBackend::attention_gemm), with at most this many bytes of scores at
// a time.
constexpr int64_t kAttnGemmMinRows = 32;
constexpr int64_t kAttnScoreBytes = int64_t{128} << 20;
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

// A K/V element as f32: the cache holds f32, or f16 bits (widened exactly).
__device__ __forceinline__ float kv_load(const float* p) {
  return *p;
}
__device__ __forceinline__ float kv_load(const uint16_t* p) {
  return __half2float(__ushort_as_half(*p));
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
template <class T>
__global__ void attention_kernel(AttentionArgs a, int64_t group) {
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

  const int64_t n_keys = min(static_cast<int64_t>(a.q_pos[qi]) + 1, a.n_kv);
  const int64_t first = first_visible_key(a, qi);
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
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += acc_s[w * hd + d] * scale_w[w];
    out[d] = o * inv_total;
  }
}

// Attention of many query rows through cuBLAS (see CudaBackend::attention):
// the scores of a block of rows are a GEMM per head, then this kernel, one
// block per (head, row), turns each row of scores into softmax weights over
// the keys that row sees (0 elsewhere; all 0 when it sees none), then a
// second GEMM per head applies them to V.  Rows are scores[(h * rows + i) *
// n_kv + j] for query row r0 + i.
__global__ void attn_softmax_rows_kernel(AttentionArgs a, int64_t r0, int64_t rows, float* scores) {
  const int64_t h = blockIdx.x / rows, i = blockIdx.x % rows;
  float* s = scores + (h * rows + i) * a.n_kv;
  const int64_t qi = r0 + i;
  const int64_t first = first_visible_key(a, qi);
  const int64_t end = min(static_cast<int64_t>(a.q_pos[qi]) + 1, a.n_kv);  // may be <= 0
  float m = -INFINITY;
  for (int64_t j = first + threadIdx.x; j < end; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m);
  float l = 0.0f;
  for (int64_t j = first + threadIdx.x; j < end; j += blockDim.x) l += expf(s[j] - m);
  l = static_cast<float>(block_sum(static_cast<double>(l)));
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t j = threadIdx.x; j < a.n_kv; j += blockDim.x) {
    s[j] = j >= first && j < end ? expf(s[j] - m) * inv : 0.0f;
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
__global__ void gelu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  CB_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g))) * up[i];
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

template <DType T>
struct LaunchDequant {
  template <class Out>
  static void run(const WeightView& w, const int32_t* ids, int64_t row0, int64_t n, Out* out,
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

// ----------------------------------------------------- per-thread state --

// Device mirrors of small read-only host inputs (the RMSNorm weight vectors
// from the mmapped model, positions and token ids in std::vector), keyed by
// host address and checked against a host copy of the bytes on every use: a
// hit costs a memcmp, a changed content is uploaded again into the same
// mirror.  So kernels see exactly the bytes the host held at the call, as if
// they were staged every time.
struct Mirror {
  std::vector<unsigned char> host;  // the bytes the device copy holds
  void* dev = nullptr;
  size_t cap = 0;
};
constexpr size_t kMirrorMaxBytes = size_t{64} << 10;  // per input
constexpr size_t kMirrorMaxTotal = size_t{64} << 20;  // all mirrors of a thread
constexpr size_t kMirrorMaxEntries = 4096;

// Page-locked bounce memory, bump-allocated.  Every host input is first
// copied here by the CPU, then uploaded by an asynchronous copy, and device
// outputs bound for host memory land here before the CPU copies them out.
// Why: cudaMemcpyAsync from pageable memory may wait for the stream (which
// would turn every mirror refresh inside a batch into a synchronisation),
// and only a CPU copy made before the op returns lets the caller reuse its
// input at once, whatever the driver does.  Blocks are only reused after the
// stream that reads them has been synchronised (reset()).
class PinnedArena {
 public:
  PinnedArena() = default;
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;
  ~PinnedArena() { release(); }

  void* get(size_t bytes) {
    bytes = (bytes + 255) & ~size_t{255};  // keeps every piece 256-byte aligned
    for (; cur_ < blocks_.size(); ++cur_) {
      Block& b = blocks_[cur_];
      if (b.cap - b.used >= bytes) {
        void* p = b.p + b.used;
        b.used += bytes;
        return p;
      }
    }
    Block b;
    b.cap = std::max(kBlockBytes, bytes);
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, b.cap, cudaHostAllocDefault), "cudaHostAlloc (bounce memory)");
    b.p = static_cast<char*>(p);
    b.used = bytes;
    blocks_.push_back(b);
    cur_ = blocks_.size() - 1;
    return b.p;
  }

  // Only once nothing queued reads the blocks any more.  A thread that once
  // staged something large gives that memory back here.
  void reset() {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.cap;
    if (total > kKeepBytes) release();
    for (Block& b : blocks_) b.used = 0;
    cur_ = 0;
  }

  void release() {
    for (const Block& b : blocks_) cudaFreeHost(b.p);
    blocks_.clear();
    cur_ = 0;
  }

 private:
  static constexpr size_t kBlockBytes = size_t{256} << 10;
  static constexpr size_t kKeepBytes = size_t{16} << 20;
  struct Block {
    char* p = nullptr;
    size_t cap = 0;
    size_t used = 0;
  };
  std::vector<Block> blocks_;
  size_t cur_ = 0;
};

// What one calling thread owns: its stream and everything that is only
// correct because it is ordered on that stream (mirrors, GEMM scratch,
// bounce memory, cuBLAS handle).  Only the owning thread touches a context
// (the backend's mutex guards the thread -> context map, not the contents).
struct ThreadCtx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;  // created at the thread's first GEMM
  int depth = 0;                  // begin_batch() nesting
  void* scratch = nullptr;        // dequantized weight slices for SGEMM
  size_t scratch_bytes = 0;
  std::unordered_map<const void*, Mirror> mirrors;
  size_t mirror_bytes = 0;
  PinnedArena arena;
  std::vector<void*> deferred;  // cudaFree after the next synchronisation (no memory pools)
  struct Upload {
    cudaEvent_t start, end;
  };
  std::vector<Upload> uploads;     // not yet summed by wait_uploads()
  std::vector<cudaEvent_t> spare;  // recycled timing events
  double upload_ms = 0.0;          // of uploads already folded out of `uploads`
  struct TimedOp {
    const char* op;
    cudaEvent_t start, end;
  };
  std::vector<TimedOp> timed;  // CB_CUDA_PROFILE: ops not yet added to the totals
};

// The thread -> context map, shared with the thread-exit hook below so a
// context can be handed to the next new thread when its thread ends (the
// fusor starts a loader thread per request; without this every request
// would leave a stream behind).  Its mutex is the backend's lock.
struct CtxTable {
  std::mutex mu;
  std::unordered_map<std::thread::id, ThreadCtx*> by_thread;
  std::vector<ThreadCtx*> idle;  // their threads have exited

  void thread_exited(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_thread.find(id);
    if (it == by_thread.end()) return;
    idle.push_back(it->second);
    by_thread.erase(it);
  }
};

// Per thread: the tables (backends) this thread has a context in, told when
// the thread ends.  A backend destroyed earlier has expired its weak_ptr.
class ThreadExitHook {
 public:
  ~ThreadExitHook() {
    const std::thread::id id = std::this_thread::get_id();
    for (const auto& w : tables_) {
      if (auto t = w.lock()) t->thread_exited(id);
    }
  }
  void add(const std::shared_ptr<CtxTable>& t) {
    tables_.erase(std::remove_if(tables_.begin(), tables_.end(),
                                 [](const std::weak_ptr<CtxTable>& w) { return w.expired(); }),
                  tables_.end());
    tables_.push_back(t);
  }

 private:
  std::vector<std::weak_ptr<CtxTable>> tables_;
};
thread_local ThreadExitHook t_exit_hook;

// Where a pointer's memory is, for an op argument.
enum class Where {
  kBackend,  // usable in place: this backend's blocks, device or managed memory
  kPinned,   // page-locked host memory the device can address at the same pointer
  kHost,     // pageable host memory
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& opts)
      : device_(device),
        gemv_max_rows_(std::clamp(opts.gemv_max_rows, 0, kGemvMaxRows)),
        table_(std::make_shared<CtxTable>()) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    int pools = 0, integrated = 0, concurrent = 0;
    cuda_check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_),
               "cudaDeviceGetAttribute");
    cuda_check(cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, device_),
               "cudaDeviceGetAttribute");
    cuda_check(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device_),
               "cudaDeviceGetAttribute");
    zero_copy_ = opts.zero_copy == CudaZeroCopy::kOn ||
                 (opts.zero_copy == CudaZeroCopy::kAuto && integrated != 0);
    // Prefetching a managed destination before a copy only helps where pages
    // migrate (a discrete GPU with concurrent managed access).
    prefetch_ = opts.prefetch_uploads && integrated == 0 && concurrent != 0;
    if (pools != 0) create_pool();
    profile_ = std::getenv("CB_CUDA_PROFILE") != nullptr;
    const char* bf16 = std::getenv("CB_CUDA_BF16");
    round_bf16_ = bf16 != nullptr && std::strcmp(bf16, "0") != 0;
  }

  ~CudaBackend() override {
    // Errors cannot be reported from a destructor; the process is usually
    // exiting or the session is being torn down.
    cudaSetDevice(device_);
    std::vector<std::unique_ptr<ThreadCtx>> ctxs;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      ctxs.swap(ctxs_);
      table_->by_thread.clear();
      table_->idle.clear();
    }
    for (auto& c : ctxs) {
      if (!c->timed.empty() && cudaStreamSynchronize(c->stream) == cudaSuccess) fold_profile(*c);
      destroy_ctx(*c);
    }
    print_profile();
    for (void* p : weights_) cudaFree(p);
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  }

  const char* name() const override { return "cuda"; }
  // GEMMs of 512 rows (the size docs/CUDA.md measures) keep the GPU busier;
  // the activations are in device memory.
  int64_t default_batch_rows() const override { return 512; }

  // ------------------------------------------------------------ memory --

  void* alloc_buffer(size_t bytes) override {
    const size_t n = bytes == 0 ? 1 : bytes;
    use_device();
    void* p = nullptr;
    cudaError_t e;
    if (zero_copy_) {
      // Mapped page-locked host memory: the host and the GPU use the same
      // pointer (unified addressing), and unlike managed memory the host may
      // write it while kernels run, which Jetson's managed memory forbids.
      e = cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable);
      if (e == cudaSuccess) {
        void* d = nullptr;
        const cudaError_t e2 = cudaHostGetDevicePointer(&d, p, 0);
        if (e2 != cudaSuccess || d != p) {
          cudaGetLastError();
          cudaFreeHost(p);
          fail(ErrorCode::kUnsupported,
               "cuda backend: zero-copy buffers need unified addressing (the device pointer of "
               "mapped host memory differs from the host pointer)");
        }
      }
    } else {
      // Managed memory is 256-byte aligned (> the interface's 64).
      e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
    }
    // Any refusal is reported as out of memory, as the CPU backend does.
    if (e != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory,
           "cuda backend: cannot allocate " + std::to_string(bytes) +
               (zero_copy_ ? " bytes of mapped host memory: " : " bytes of managed memory: ") +
               cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    owned_[reinterpret_cast<uintptr_t>(p)] = Block{n, zero_copy_ ? Kind::kMapped : Kind::kManaged};
    return p;
  }

  void free_buffer(void* p) override {
    if (p == nullptr) return;
    Kind kind;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = owned_.find(reinterpret_cast<uintptr_t>(p));
      check(it != owned_.end() && it->second.kind != Kind::kWeight,
            "free_buffer: not a buffer from this backend's alloc_buffer()");
      kind = it->second.kind;
      owned_.erase(it);
    }
    // Outside the lock: freeing may wait for the device.
    use_device();
    cuda_check(kind == Kind::kMapped ? cudaFreeHost(p) : cudaFree(p), "cudaFree");
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
    ThreadCtx& c = this_thread_ctx();
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (weight)");
    // Waited for on the thread's own stream: a plain cudaMemcpy from
    // pageable memory may return before its DMA lands, and kernels on other
    // (non-blocking) streams would not wait for it.
    cudaError_t e = cudaMemcpyAsync(p, host.data, bytes, cudaMemcpyDefault, c.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c.stream);
    if (e != cudaSuccess) {
      cudaFree(p);
      cuda_check(e, "cudaMemcpy (weight upload)");
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    weights_.push_back(p);
    owned_[reinterpret_cast<uintptr_t>(p)] = Block{bytes, Kind::kWeight};
    dev.data = p;
    return dev;
  }

  // --------------------------------------------------------------- ops --

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (n_rows == 0 || w.n_out == 0) return;
    Call c(*this);
    const float* dx = c.in(x, n_rows * w.n_in);
    float* dy = c.out(y, n_rows * w.n_out, false);
    if (w.n_in == 0) {
      cuda_check(
          cudaMemsetAsync(dy, 0, static_cast<size_t>(n_rows * w.n_out) * sizeof(float), c.stream()),
          "cudaMemsetAsync");
    } else if (n_rows <= gemv_max_rows_) {
      c.name("matmul gemv");
      dispatch_type<LaunchGemv>(w.type, w, dx, static_cast<int>(n_rows), dy, c.stream());
    } else {
      c.name("matmul gemm");
      gemm(c.ctx(), w, dx, n_rows, dy);
    }
    c.finish();
  }

  // The exact product, unless CB_CUDA_BF16 asks for the rounded one the
  // interface allows here: weights and activations rounded to bf16 (8-bit
  // significands, f32's range), products summed in f32.  Many rows run on
  // tensor cores (the exact f32 SGEMM reached ~18 TFLOP/s on a 1.5B model's
  // prefill on an H100); few rows take the GEMV with the same rounding, so
  // rows round alike on either path.  Not the default until it is held to
  // the float64 reference and the C API's identities (prefix reuse
  // reproduces full prefill to 1e-3) on a real model on a GPU: the
  // same-shape clones a GPU machine here can receive are too ill-conditioned
  // to tell (both paths miss those identities on them; docs/CUDA.md).
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    if (!round_bf16_) return matmul(w, x, n_rows, y);
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (w.n_in == 0) return matmul(w, x, n_rows, y);
    if (n_rows == 0 || w.n_out == 0) return;
    Call c(*this, "matmul_q8 gemv bf16");
    const float* dx = c.in(x, n_rows * w.n_in);
    float* dy = c.out(y, n_rows * w.n_out, false);
    if (n_rows <= gemv_max_rows_) {
      dispatch_type<LaunchGemvBf16>(w.type, w, dx, static_cast<int>(n_rows), dy, c.stream());
    } else {
      c.name("matmul_q8 gemm bf16");
      gemm_bf16(c.ctx(), w, dx, n_rows, dy);
    }
    c.finish();
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    check(n >= 0, "get_rows: negative count");
    if (n == 0 || w.n_in == 0) return;
    Call c(*this);
    const int32_t* dids = c.in(ids, n);
    float* dout = c.out(out, n * w.n_in, false);
    dispatch_type<LaunchDequant>(w.type, w, dids, int64_t{0}, n, dout, c.stream());
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
    rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, c.stream()>>>(dx, dw, dim, eps,
                                                                                  dout);
    launch_check("rmsnorm_kernel");
    c.finish();
  }

  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    check(n_rows >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape");
    check(rot_dim >= 0 && rot_dim <= head_dim && rot_dim % 2 == 0,
          "rope: rot_dim must be even and at most head_dim");
    if (n_rows == 0 || rot_dim == 0) return;
    Call c(*this);
    float* dx = c.out(x, n_rows * n_heads * head_dim, true);
    const int32_t* dpos = c.in(pos, n_rows);
    const float* dfactors = freq_factors ? c.in(freq_factors, rot_dim / 2) : nullptr;
    const int64_t total = n_rows * (rot_dim / 2);
    rope_kernel<<<grid_for(total), kEltThreads, 0, c.stream()>>>(
        dx, dpos, n_rows, n_heads, head_dim, rot_dim, freq_base, dfactors);
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
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16, "attention: K/V must be F32 or F16");
    if (a.n_q == 0) return;
    check(a.n_q * a.n_head <= INT32_MAX, "attention: too many query rows x heads");
    Call c(*this);
    AttentionArgs d = a;
    const int64_t q_elems = a.n_q * a.n_head * a.head_dim;
    d.q = c.in(a.q, q_elems);
    d.q_pos = c.in(a.q_pos, a.n_q);
    stage_kv(c, a, d);
    d.out = c.out(a.out, q_elems, false);
    if (a.n_q >= kAttnGemmMinRows && a.n_kv > 0) {
      c.name("attention gemm");
      attention_gemm(c, d);
      c.finish();
      return;
    }
    const size_t smem = static_cast<size_t>(kAttnWarps * (a.head_dim + 2)) * sizeof(float);
    const unsigned blocks = static_cast<unsigned>(a.n_q * a.n_head);
    if (a.kv_type == DType::F16) {
      attention_kernel<uint16_t>
          <<<blocks, 32 * kAttnWarps, smem, c.stream()>>>(d, a.n_head / a.n_head_kv);
    } else {
      attention_kernel<float>
          <<<blocks, 32 * kAttnWarps, smem, c.stream()>>>(d, a.n_head / a.n_head_kv);
    }
    launch_check("attention_kernel");
    c.finish();
  }

  void attention_contributions(const AttentionArgs& a, float* out) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention_contributions: bad shape");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention_contributions: n_head must be a multiple of n_head_kv");
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16,
          "attention_contributions: K/V must be F32 or F16");
    if (a.n_q == 0 || a.n_kv == 0) return;
    check(a.n_q * a.n_head <= INT32_MAX, "attention_contributions: too many query rows x heads");
    Call c(*this);
    AttentionArgs d = a;
    d.q = c.in(a.q, a.n_q * a.n_head * a.head_dim);
    d.q_pos = c.in(a.q_pos, a.n_q);
    stage_kv(c, a, d);
    float* dout = c.out(out, a.n_kv, true);
    attention_gemm(c, d, dout);
    c.finish();
  }

  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(n >= 0, "silu_mul: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* dg = c.in(gate, n);
    const float* du = c.in(up, n);
    float* dout = c.out(out, n, false);
    silu_mul_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dg, du, n, dout);
    launch_check("silu_mul_kernel");
    c.finish();
  }

  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(n >= 0, "gelu_mul: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* dg = c.in(gate, n);
    const float* du = c.in(up, n);
    float* dout = c.out(out, n, false);
    gelu_mul_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dg, du, n, dout);
    launch_check("gelu_mul_kernel");
    c.finish();
  }

  void scale(float* x, int64_t n, float s) override {
    check(n >= 0, "scale: negative size");
    if (n == 0) return;
    Call c(*this);
    float* dx = c.out(x, n, true);
    scale_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dx, n, s);
    launch_check("scale_kernel");
    c.finish();
  }

  void add(const float* a, const float* b, int64_t n, float* out) override {
    check(n >= 0, "add: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* da = c.in(a, n);
    const float* db = c.in(b, n);
    float* dout = c.out(out, n, false);
    add_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(da, db, n, dout);
    launch_check("add_kernel");
    c.finish();
  }

  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    check(n_rows >= 0 && dim > 0, "add_bias: bad shape");
    if (n_rows == 0) return;
    Call c(*this);
    float* dx = c.out(x, n_rows * dim, true);
    const float* db = c.in(bias, dim);
    add_bias_kernel<<<grid_for(n_rows * dim), kEltThreads, 0, c.stream()>>>(dx, db, n_rows * dim,
                                                                            dim);
    launch_check("add_bias_kernel");
    c.finish();
  }

  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    // A host source's extent is known only from the indices, so it is
    // staged up to the largest one; the runtime passes backend buffers.
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in_unknown_extent(src, row_len, idx, n);
    float* ddst = c.out(dst, n * row_len, false);
    gather_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len, didx,
                                                                              n, ddst);
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
    // dst's extent is not part of the call, so it cannot be staged: it must
    // be memory the device writes in place.
    float* ddst = c.out_in_place(dst);
    check(ddst != nullptr, "scatter_rows: dst must be backend memory");
    scatter_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len, didx,
                                                                               n, ddst);
    launch_check("scatter_rows_kernel");
    c.finish();
  }

  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    check(n >= 0 && row_len >= 0, "scatter_rows_f16: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in(src, n * row_len);
    // As scatter_rows: dst's extent is not part of the call.
    uint16_t* ddst = c.out_in_place(dst);
    check(ddst != nullptr, "scatter_rows_f16: dst must be backend memory");
    scatter_rows_f16_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len,
                                                                                   didx, n, ddst);
    launch_check("scatter_rows_f16_kernel");
    c.finish();
  }

  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows_f16: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const uint16_t* dsrc = c.in_unknown_extent(src, row_len, idx, n);
    float* ddst = c.out(dst, n * row_len, false);
    gather_rows_f16_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len,
                                                                                  didx, n, ddst);
    launch_check("gather_rows_f16_kernel");
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
    row_sq_diff_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, c.stream()>>>(
        da, db, row_len, dout);
    launch_check("row_sq_diff_kernel");
    c.finish();
  }

  // A stable radix sort of (key, index) by the keys of topk_keys_kernel
  // lists the indices best first with ties in index order; the first k of
  // them, sorted again, are the answer.  Only k indices cross to the host,
  // not the n deviations.
  void top_k(const float* values, int64_t n, int64_t k, int32_t* out) override {
    check(n >= 0 && k >= 0 && k <= n, "top_k: need 0 <= k <= n");
    check(n == 0 || values != nullptr, "top_k: values is null");
    check(k == 0 || out != nullptr, "top_k: out is null");
    check(n <= INT32_MAX, "top_k: more than 2^31 - 1 values");
    if (k == 0) return;
    Call c(*this);
    const float* dv = c.in(values, n);
    int32_t* dout = c.out(out, k, false);
    const int ni = static_cast<int>(n), ki = static_cast<int>(k);
    size_t sort_bytes = 0, final_bytes = 0;
    cuda_check(
        cub::DeviceRadixSort::SortPairs(
            nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
            static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), ni, 0, 32, c.stream()),
        "cub SortPairs (size)");
    cuda_check(
        cub::DeviceRadixSort::SortKeys(nullptr, final_bytes, static_cast<int32_t*>(nullptr),
                                       static_cast<int32_t*>(nullptr), ki, 0, 32, c.stream()),
        "cub SortKeys (size)");
    const size_t arr = (static_cast<size_t>(n) * 4 + 255) & ~size_t{255};
    char* t = static_cast<char*>(c.temp(4 * arr + std::max(sort_bytes, final_bytes)));
    uint32_t* keys_in = reinterpret_cast<uint32_t*>(t);
    uint32_t* keys_out = reinterpret_cast<uint32_t*>(t + arr);
    int32_t* idx_in = reinterpret_cast<int32_t*>(t + 2 * arr);
    int32_t* idx_out = reinterpret_cast<int32_t*>(t + 3 * arr);
    void* work = t + 4 * arr;
    topk_keys_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dv, n, keys_in, idx_in);
    launch_check("topk_keys_kernel");
    cuda_check(cub::DeviceRadixSort::SortPairs(work, sort_bytes, keys_in, keys_out, idx_in, idx_out,
                                               ni, 0, 32, c.stream()),
               "cub SortPairs");
    cuda_check(
        cub::DeviceRadixSort::SortKeys(work, final_bytes, idx_out, dout, ki, 0, 32, c.stream()),
        "cub SortKeys");
    c.finish();
  }

  // ----------------------------------------------------------- batches --

  void begin_batch() override { ++this_thread_ctx().depth; }

  void end_batch() override {
    ThreadCtx& c = this_thread_ctx();
    check(c.depth > 0, "end_batch without a matching begin_batch on this thread");
    if (--c.depth == 0) sync(c);
  }

  // ----------------------------------------------------------- uploads --

  bool wants_staged_uploads() const override { return !zero_copy_; }

  void* alloc_host_staging(size_t bytes) override {
    use_device();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory,
           "cuda backend: cannot allocate " + std::to_string(bytes) +
               " bytes of page-locked staging memory: " + cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    staging_.insert(p);
    return p;
  }

  void free_host_staging(void* p) override {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      check(staging_.erase(p) == 1,
            "free_host_staging: not memory from this backend's alloc_host_staging()");
    }
    use_device();
    cuda_check(cudaFreeHost(p), "cudaFreeHost");
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check(dst != nullptr && src != nullptr, "upload: null pointer");
    ThreadCtx& c = this_thread_ctx();
    bool managed = false;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      const auto [start, block] = owned_block(dst);
      check(block != nullptr && block->kind != Kind::kWeight,
            "upload: dst must lie in a buffer from alloc_buffer()");
      check(bytes <= block->bytes - (reinterpret_cast<uintptr_t>(dst) - start),
            "upload: dst + bytes runs past the end of its buffer");
      managed = block->kind == Kind::kManaged;
    }
    if (managed && prefetch_) {
      // Pages of a managed buffer last touched by the host live in host
      // memory, and a copy into them would not be a DMA to the GPU; moving
      // them first keeps the timed copy a plain host-to-device transfer.
#if CUDART_VERSION >= 13000
      cudaMemLocation loc{};
      loc.type = cudaMemLocationTypeDevice;
      loc.id = device_;
      cuda_check(cudaMemPrefetchAsync(dst, bytes, loc, 0, c.stream), "cudaMemPrefetchAsync");
#else
      cuda_check(cudaMemPrefetchAsync(dst, bytes, device_, c.stream), "cudaMemPrefetchAsync");
#endif
    }
    ThreadCtx::Upload u{event(c), event(c)};
    const cudaError_t e1 = cudaEventRecord(u.start, c.stream);
    const cudaError_t e2 =
        e1 == cudaSuccess ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.stream) : e1;
    const cudaError_t e3 = e2 == cudaSuccess ? cudaEventRecord(u.end, c.stream) : e2;
    if (e3 != cudaSuccess) {
      c.spare.push_back(u.start);
      c.spare.push_back(u.end);
      cuda_check(e3, "upload (cudaMemcpyAsync)");
    }
    c.uploads.push_back(u);
    // A caller that never asks for the time must not make the list grow
    // without bound: completed copies are summed and their events reused.
    if (c.uploads.size() >= 256) fold_uploads(c);
  }

  double wait_uploads() override {
    ThreadCtx& c = this_thread_ctx();
    if (!c.uploads.empty()) {
      cuda_check(cudaEventSynchronize(c.uploads.back().end), "upload");
    }
    fold_uploads(c);
    const double ms = c.upload_ms;
    c.upload_ms = 0.0;
    return ms;
  }

  // A GPU timestamp on the calling thread's stream (cuda_mark()).
  std::shared_ptr<CudaEvent> mark() {
    ThreadCtx& c = this_thread_ctx();
    auto e = std::make_shared<CudaEvent>();
    cuda_check(cudaEventCreate(&e->ev), "cudaEventCreate");
    cuda_check(cudaEventRecord(e->ev, c.stream), "cudaEventRecord");
    return e;
  }

 private:
  // The K and V of an attention call on the device: staged when host memory
  // (tests), as elements of the call's kv_type.
  template <class C>
  static void stage_kv(C& c, const AttentionArgs& a, AttentionArgs& d) {
    const int64_t kv_elems = a.n_kv * a.n_head_kv * a.head_dim;
    if (a.kv_type == DType::F16) {
      d.k = c.in(static_cast<const uint16_t*>(a.k), kv_elems);
      d.v = c.in(static_cast<const uint16_t*>(a.v), kv_elems);
    } else {
      d.k = c.in(static_cast<const float*>(a.k), kv_elems);
      d.v = c.in(static_cast<const float*>(a.v), kv_elems);
    }
  }

  enum class Kind { kManaged, kMapped, kWeight };
  struct Block {
    size_t bytes;
    Kind kind;
  };

  // One op: makes host arguments usable on the device (mirrors, staging
  // through bounce memory, outputs copied back), and ends by waiting for the
  // thread's stream unless inside a batch.  Holds no lock: everything it
  // touches belongs to the calling thread's context.
  class Call {
   public:
    // `op` names the op in the CB_CUDA_PROFILE totals: the calling member
    // function unless given.
    explicit Call(CudaBackend& be, const char* op = __builtin_FUNCTION())
        : be_(be), ctx_(be.this_thread_ctx()), op_(op) {
      if (ctx_.mirror_bytes > kMirrorMaxTotal || ctx_.mirrors.size() > kMirrorMaxEntries) {
        be_.drop_mirrors(ctx_);
      }
      if (be_.profile_) {
        start_ = be_.event(ctx_);
        cuda_check(cudaEventRecord(start_, ctx_.stream), "cudaEventRecord");
      }
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // Frees are stream-ordered, so they also run after work this call
    // queued before an exception.
    ~Call() {
      release_temps();
      if (start_ != nullptr) ctx_.spare.push_back(start_);
    }

    cudaStream_t stream() const { return ctx_.stream; }
    void name(const char* op) { op_ = op; }
    ThreadCtx& ctx() { return ctx_; }

    template <class T>
    const T* in(const T* p, int64_t n) {
      if (p == nullptr || n == 0 || be_.where(p) == Where::kBackend) return p;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      if (bytes <= kMirrorMaxBytes) return static_cast<const T*>(mirror(p, bytes));
      void* d = temp(bytes);
      to_device(d, p, bytes);
      return static_cast<const T*>(d);
    }

    // An output of n elements; with copy_in it is also an input (in place).
    // Host memory makes the op complete before it returns, batch or not.
    template <class T>
    T* out(T* p, int64_t n, bool copy_in) {
      if (p == nullptr || n == 0) return p;
      if (T* d = out_in_place(p)) return d;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      void* d = temp(bytes);
      if (copy_in) to_device(d, p, bytes);
      backs_.push_back({p, d, nullptr, bytes});
      host_out_ = true;
      return static_cast<T*>(d);
    }

    // p itself when the device can write it (page-locked host memory makes
    // the op complete before returning), else null.
    template <class T>
    T* out_in_place(T* p) {
      const Where w = be_.where(p);
      if (w == Where::kPinned) host_out_ = true;
      return w == Where::kHost ? nullptr : p;
    }

    // A gather source in host memory: its extent is 1 + the largest row
    // index, read from idx wherever it lives.
    template <class T>
    const T* in_unknown_extent(const T* src, int64_t row_len, const int32_t* idx, int64_t n) {
      if (be_.where(src) == Where::kBackend) return src;
      const int32_t* hidx = idx;
      if (be_.where(idx) == Where::kBackend) {
        // Queued work may still write idx: wait for it (no lock is held).
        void* b = ctx_.arena.get(static_cast<size_t>(n) * sizeof(int32_t));
        cuda_check(cudaMemcpyAsync(b, idx, static_cast<size_t>(n) * sizeof(int32_t),
                                   cudaMemcpyDefault, ctx_.stream),
                   "cudaMemcpyAsync (indices)");
        cuda_check(cudaStreamSynchronize(ctx_.stream), "cudaStreamSynchronize");
        hidx = static_cast<const int32_t*>(b);
      }
      const int64_t rows = 1 + static_cast<int64_t>(*std::max_element(hidx, hidx + n));
      check(rows > 0, "gather_rows: negative row index");
      return in(src, rows * row_len);
    }

    // Device scratch for this op, freed (stream-ordered) when the op ends.
    void* temp(size_t bytes) {
      void* d = be_.dev_alloc(ctx_, bytes, "staging");
      temps_.push_back(d);
      return d;
    }

    // Copies staged outputs back and, outside a batch or for a host output,
    // waits for everything the thread queued.
    void finish() {
      for (Back& b : backs_) {
        b.bounce = ctx_.arena.get(b.bytes);
        cuda_check(cudaMemcpyAsync(b.bounce, b.dev, b.bytes, cudaMemcpyDeviceToHost, ctx_.stream),
                   "cudaMemcpyAsync (stage out)");
      }
      release_temps();
      if (start_ != nullptr) {
        cudaEvent_t end = be_.event(ctx_);
        cuda_check(cudaEventRecord(end, ctx_.stream), "cudaEventRecord");
        ctx_.timed.push_back({op_, start_, end});
        start_ = nullptr;
      }
      if (ctx_.depth > 0 && !host_out_) return;  // end_batch() waits
      cuda_check(cudaStreamSynchronize(ctx_.stream), "kernel execution");
      for (const Back& b : backs_) std::memcpy(b.host, b.bounce, b.bytes);
      be_.after_sync(ctx_);
    }

   private:
    struct Back {
      void* host;
      const void* dev;
      void* bounce;
      size_t bytes;
    };

    // Host bytes -> device, through bounce memory (see PinnedArena).
    void to_device(void* d, const void* h, size_t bytes) {
      void* b = ctx_.arena.get(bytes);
      std::memcpy(b, h, bytes);
      cuda_check(cudaMemcpyAsync(d, b, bytes, cudaMemcpyHostToDevice, ctx_.stream),
                 "cudaMemcpyAsync (stage in)");
    }

    // The device mirror of host input [p, p + bytes), uploaded when its
    // content differs from what the mirror holds.  Rewriting a mirror that
    // queued kernels still read is safe: the copy is ordered after them on
    // the same stream.
    const void* mirror(const void* p, size_t bytes) {
      Mirror& m = ctx_.mirrors[p];
      if (m.host.size() == bytes && std::memcmp(m.host.data(), p, bytes) == 0) return m.dev;
      m.host.clear();  // stays empty (a miss) if the upload below fails
      if (m.cap < bytes) {
        // An earlier argument of this very op may use the old copy, and its
        // kernel is not queued yet: free it when the op ends.
        if (m.dev != nullptr) retired_.push_back(m.dev);
        ctx_.mirror_bytes -= m.cap;
        m.dev = nullptr;
        m.cap = 0;
        m.dev = be_.dev_alloc(ctx_, bytes, "mirror");
        m.cap = bytes;
        ctx_.mirror_bytes += bytes;
      }
      to_device(m.dev, p, bytes);
      m.host.assign(static_cast<const unsigned char*>(p),
                    static_cast<const unsigned char*>(p) + bytes);
      return m.dev;
    }

    void release_temps() {
      for (void* p : temps_) be_.dev_free(ctx_, p);
      for (void* p : retired_) be_.dev_free(ctx_, p);
      temps_.clear();
      retired_.clear();
    }

    CudaBackend& be_;
    ThreadCtx& ctx_;
    std::vector<void*> temps_;
    std::vector<void*> retired_;
    std::vector<Back> backs_;
    bool host_out_ = false;
    const char* op_;
    cudaEvent_t start_ = nullptr;
  };

  // The device is per host thread in the CUDA runtime; a session may call
  // from any thread, so every entry point selects it.
  void use_device() const {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  }

  // The calling thread's context: found, or handed over from an exited
  // thread, or created (a stream per thread).
  ThreadCtx& this_thread_ctx() {
    use_device();
    const std::thread::id id = std::this_thread::get_id();
    ThreadCtx* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = table_->by_thread.find(id);
      if (it != table_->by_thread.end()) return *it->second;
      if (!table_->idle.empty()) {
        c = table_->idle.back();
        table_->idle.pop_back();
        table_->by_thread[id] = c;
      }
    }
    if (c != nullptr) {
      // What the exited thread left queued stays ordered before the new
      // thread's work on the same stream; only its bookkeeping is reset.
      c->depth = 0;
      for (const auto& u : c->uploads) {
        c->spare.push_back(u.start);
        c->spare.push_back(u.end);
      }
      c->uploads.clear();
      c->upload_ms = 0.0;
    } else {
      auto fresh = std::make_unique<ThreadCtx>();
      cuda_check(cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
      c = fresh.get();
      std::lock_guard<std::mutex> lock(table_->mu);
      ctxs_.push_back(std::move(fresh));
      table_->by_thread[id] = c;
    }
    t_exit_hook.add(table_);
    return *c;
  }

  void destroy_ctx(ThreadCtx& c) {
    for (auto& [p, m] : c.mirrors) dev_free(c, m.dev);
    c.mirrors.clear();
    dev_free(c, c.scratch);
    cudaStreamSynchronize(c.stream);
    for (void* p : c.deferred) cudaFree(p);
    c.deferred.clear();
    c.arena.release();
    for (const auto& u : c.uploads) {
      cudaEventDestroy(u.start);
      cudaEventDestroy(u.end);
    }
    for (const auto& t : c.timed) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
    for (cudaEvent_t e : c.spare) cudaEventDestroy(e);
    if (c.blas != nullptr) cublasDestroy(c.blas);
    cudaStreamDestroy(c.stream);
    cudaGetLastError();
  }

  // The block of owned_ holding p (its start and record), or {0, null}.
  // Caller holds the lock.
  std::pair<uintptr_t, const Block*> owned_block(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = owned_.upper_bound(a);
    if (it == owned_.begin()) return {0, nullptr};
    --it;
    if (a - it->first >= it->second.bytes) return {0, nullptr};
    return {it->first, &it->second};
  }

  // Blocks this backend allocated are found without a driver call; other
  // pointers ask the driver once per argument.
  Where where(const void* p) const {
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      if (owned_block(p).second != nullptr) return Where::kBackend;
    }
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();
      return Where::kHost;
    }
    switch (attr.type) {
      case cudaMemoryTypeDevice:
      case cudaMemoryTypeManaged:
        return Where::kBackend;
      case cudaMemoryTypeHost:
        return attr.devicePointer == p ? Where::kPinned : Where::kHost;
      default:
        return Where::kHost;
    }
  }

  // A pool of our own instead of the device's default one: a release
  // threshold keeps staging memory between synchronisations (the default
  // pool gives it back to the driver at every one), and no reuse across
  // streams by inserted dependencies, which would make the compute stream
  // wait for the loader's.
  void create_pool() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    if (cudaMemPoolCreate(&pool_, &props) != cudaSuccess) {
      cudaGetLastError();
      pool_ = nullptr;  // plain cudaMalloc / deferred cudaFree
      return;
    }
    uint64_t keep = uint64_t{256} << 20;
    int no = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
    cudaMemPoolSetAttribute(pool_, cudaMemPoolReuseAllowInternalDependencies, &no);
    cudaGetLastError();
  }

  // Device memory used only on c.stream: stream-ordered from the pool where
  // the device has memory pools, else cudaMalloc.
  void* dev_alloc(ThreadCtx& c, size_t bytes, const char* what) {
    void* d = nullptr;
    const cudaError_t e = pool_ != nullptr
                              ? cudaMallocFromPoolAsync(&d, bytes == 0 ? 1 : bytes, pool_, c.stream)
                              : cudaMalloc(&d, bytes == 0 ? 1 : bytes);
    cuda_check(e, what);
    return d;
  }

  // Runs after the work already queued on c.stream, so kernels still reading
  // p are safe; without pools the free waits for the thread's next
  // synchronisation.
  void dev_free(ThreadCtx& c, void* p) {
    if (p == nullptr) return;
    if (pool_ != nullptr) {
      if (cudaFreeAsync(p, c.stream) != cudaSuccess) cudaGetLastError();
    } else {
      c.deferred.push_back(p);
    }
  }

  void drop_mirrors(ThreadCtx& c) {
    for (auto& [p, m] : c.mirrors) dev_free(c, m.dev);
    c.mirrors.clear();
    c.mirror_bytes = 0;
  }

  // After c.stream has drained: what waited for it can be reused or freed.
  void after_sync(ThreadCtx& c) {
    if (!c.timed.empty()) fold_profile(c);
    for (void* p : c.deferred) cudaFree(p);
    c.deferred.clear();
    c.arena.reset();
  }

  // Waits for everything the thread queued.  Execution errors of any queued
  // kernel surface here.
  void sync(ThreadCtx& c) {
    cuda_check(cudaStreamSynchronize(c.stream), "kernel execution");
    after_sync(c);
  }

  // CB_CUDA_PROFILE: adds the thread's timed ops, all complete after a
  // synchronisation, to the per-op totals and recycles their events.  An
  // op's time runs from the stream reaching its start to its last work, so
  // it includes the GPU waiting for the host to queue that work.
  void fold_profile(ThreadCtx& c) {
    std::vector<std::pair<const char*, float>> times;
    times.reserve(c.timed.size());
    for (const ThreadCtx::TimedOp& t : c.timed) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, t.start, t.end) != cudaSuccess) {
        cudaGetLastError();
        ms = 0.0f;
      }
      times.emplace_back(t.op, ms);
      c.spare.push_back(t.start);
      c.spare.push_back(t.end);
    }
    c.timed.clear();
    std::lock_guard<std::mutex> lock(table_->mu);
    for (const auto& [op, ms] : times) {
      ProfileTotal& total = profile_totals_[op];
      ++total.calls;
      total.ms += ms;
    }
  }

  void print_profile() const {
    if (!profile_ || profile_totals_.empty()) return;
    std::vector<std::pair<std::string, ProfileTotal>> rows(profile_totals_.begin(),
                                                           profile_totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double all = 0.0;
    for (const auto& r : rows) all += r.second.ms;
    std::fprintf(stderr, "cuda profile (CB_CUDA_PROFILE): GPU time per op, %.1f ms in all\n", all);
    std::fprintf(stderr, "  %-26s %9s %11s %6s %10s\n", "op", "calls", "total ms", "share",
                 "mean us");
    for (const auto& [op, t] : rows) {
      std::fprintf(stderr, "  %-26s %9lld %11.2f %5.1f%% %10.2f\n", op.c_str(), t.calls, t.ms,
                   all > 0 ? 100.0 * t.ms / all : 0.0,
                   1000.0 * t.ms / static_cast<double>(t.calls));
    }
  }

  cudaEvent_t event(ThreadCtx& c) {
    if (!c.spare.empty()) {
      cudaEvent_t e = c.spare.back();
      c.spare.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreate(&e), "cudaEventCreate");
    return e;
  }

  // Adds the times of the completed uploads, oldest first, to c.upload_ms
  // and recycles their events.  Copies complete in stream order, so the
  // first unfinished one ends the scan.
  void fold_uploads(ThreadCtx& c) {
    size_t done = 0;
    for (; done < c.uploads.size(); ++done) {
      const ThreadCtx::Upload& u = c.uploads[done];
      const cudaError_t q = cudaEventQuery(u.end);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        break;
      }
      cuda_check(q, "upload");
      float ms = 0.0f;
      cuda_check(cudaEventElapsedTime(&ms, u.start, u.end), "cudaEventElapsedTime");
      c.upload_ms += ms;
      c.spare.push_back(u.start);
      c.spare.push_back(u.end);
    }
    c.uploads.erase(c.uploads.begin(), c.uploads.begin() + static_cast<std::ptrdiff_t>(done));
  }

  cublasHandle_t blas(ThreadCtx& c) {
    if (c.blas == nullptr) {
      cublasHandle_t h = nullptr;
      if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fail(ErrorCode::kInternal, "cuda backend: cublasCreate failed");
      }
      c.blas = h;
      cublas_check(cublasSetStream(h, c.stream), "cublasSetStream");
      // Plain f32 arithmetic (no TF32 tensor cores): see the numerics note
      // at the top of this file.
      cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    }
    return c.blas;
  }

  // y = x W^T for many rows: W slice by slice to f32, then SGEMM.  In
  // column-major terms (cuBLAS), y^T[o][r] = sum_i W[o][i] x[r][i] is
  // C(n_out x n_rows, ld n_out) = A^T B with A = the weight slice seen as
  // an n_in x rows column-major matrix and B = x as n_in x n_rows.
  void gemm(ThreadCtx& c, const WeightView& w, const float* x, int64_t n_rows, float* y) {
    check(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
          "matmul: dimension too large for cuBLAS");
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = blas(c);
    if (w.type == DType::F32) {
      cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n_out),
                               static_cast<int>(n_rows), static_cast<int>(w.n_in), &one,
                               static_cast<const float*>(w.data), static_cast<int>(w.n_in), x,
                               static_cast<int>(w.n_in), &zero, y, static_cast<int>(w.n_out)),
                   "cublasSgemm");
      return;
    }
    const int64_t row_floats = w.n_in;
    const int64_t slice = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmScratchBytes / sizeof(float)) / row_floats, 1, w.n_out);
    auto* wf = static_cast<float*>(
        gemm_scratch(c, static_cast<size_t>(slice * row_floats) * sizeof(float)));
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int64_t rows = std::min(slice, w.n_out - o0);
      // Same stream: the next slice's dequantization waits for this SGEMM.
      dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0, rows, wf,
                                   c.stream);
      cublas_check(
          cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n_rows),
                      static_cast<int>(w.n_in), &one, wf, static_cast<int>(w.n_in), x,
                      static_cast<int>(w.n_in), &zero, y + o0, static_cast<int>(w.n_out)),
          "cublasSgemm");
    }
  }

  // attention() for many query rows, and attention_contributions(): per
  // block of rows and per head, the
  // scores by cuBLAS SGEMM (f32, K and V widened from an f16 cache first),
  // softmax over each row's visible keys, and the weighted sum of V by a
  // second SGEMM.  It does the full n_kv-wide products (masked keys get
  // weight 0), about twice a causal kernel's arithmetic, but at cuBLAS's
  // rate: the one-block-per-(row, head) kernel ran a 4k-token prefill's
  // attention at ~4 TFLOP/s on an H100.  Scores take at most
  // kAttnScoreBytes; the arguments are device pointers (staged by the Call).
  // With `contributions` (attention_contributions), each block's weights
  // are summed per key into it instead of applied to V.
  template <class C>
  void attention_gemm(C& c, const AttentionArgs& d, float* contributions = nullptr) {
    check(d.n_kv <= INT32_MAX && d.head_dim * d.n_head <= INT32_MAX,
          "attention: dimension too large for cuBLAS");
    ThreadCtx& ctx = c.ctx();
    const int64_t hd = d.head_dim, group = d.n_head / d.n_head_kv;
    const int64_t kv_elems = d.n_kv * d.n_head_kv * hd;
    const float* k = static_cast<const float*>(d.k);
    const float* v = static_cast<const float*>(d.v);
    if (d.kv_type == DType::F16) {
      auto* kv = static_cast<float*>(c.temp(static_cast<size_t>(2 * kv_elems) * sizeof(float)));
      widen_f16_kernel<<<grid_for(kv_elems), kEltThreads, 0, c.stream()>>>(
          static_cast<const uint16_t*>(d.k), kv_elems, kv);
      widen_f16_kernel<<<grid_for(kv_elems), kEltThreads, 0, c.stream()>>>(
          static_cast<const uint16_t*>(d.v), kv_elems, kv + kv_elems);
      launch_check("widen_f16_kernel");
      k = kv;
      v = kv + kv_elems;
    }
    const int64_t row_bytes = d.n_head * d.n_kv * static_cast<int64_t>(sizeof(float));
    const int64_t block_rows = std::clamp<int64_t>(kAttnScoreBytes / row_bytes, 1, d.n_q);
    auto* scores = static_cast<float*>(c.temp(static_cast<size_t>(block_rows * row_bytes)));
    cublasHandle_t h = blas(ctx);
    const float zero = 0.0f, one = 1.0f;
    const int n_kv = static_cast<int>(d.n_kv), dim = static_cast<int>(hd);
    const int q_ld = static_cast<int>(d.n_head * hd), kv_ld = static_cast<int>(d.n_head_kv * hd);
    for (int64_t r0 = 0; r0 < d.n_q; r0 += block_rows) {
      const int64_t rows = std::min(block_rows, d.n_q - r0);
      for (int64_t head = 0; head < d.n_head; ++head) {
        // Column-major: scores_h^T (n_kv x rows) = K_g (n_kv x hd) Q_h^T.
        const int64_t g = head / group;
        cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n_kv, static_cast<int>(rows), dim,
                                 &d.scale, k + g * hd, kv_ld, d.q + r0 * q_ld + head * hd, q_ld,
                                 &zero, scores + head * rows * d.n_kv, n_kv),
                     "cublasSgemm (attention scores)");
      }
      attn_softmax_rows_kernel<<<static_cast<unsigned>(d.n_head * rows), kRowThreads, 0,
                                 c.stream()>>>(d, r0, rows, scores);
      launch_check("attn_softmax_rows_kernel");
      if (contributions != nullptr) {
        attn_key_sums_kernel<<<grid_for(d.n_kv), kEltThreads, 0, c.stream()>>>(d, rows, scores, v,
                                                                               contributions);
        launch_check("attn_key_sums_kernel");
        continue;
      }
      for (int64_t head = 0; head < d.n_head; ++head) {
        // out_h^T (hd x rows) = V_g^T (hd x n_kv) weights_h^T (n_kv x rows).
        const int64_t g = head / group;
        cublas_check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, dim, static_cast<int>(rows), n_kv,
                                 &one, v + g * hd, kv_ld, scores + head * rows * d.n_kv, n_kv,
                                 &zero, d.out + r0 * q_ld + head * hd, q_ld),
                     "cublasSgemm (attention values)");
      }
    }
  }

  // The scratch of a thread's GEMMs: at least `bytes` (queued GEMMs may
  // still read the old one: its free is ordered after them).
  void* gemm_scratch(ThreadCtx& c, size_t bytes) {
    if (c.scratch_bytes < bytes) {
      dev_free(c, c.scratch);
      c.scratch = nullptr;
      c.scratch_bytes = 0;
      c.scratch = dev_alloc(c, bytes, "gemm scratch");
      c.scratch_bytes = bytes;
    }
    return c.scratch;
  }

  // matmul_q8's many-row product: bf16 operands on tensor cores, f32 sums.
  void gemm_bf16(ThreadCtx& c, const WeightView& w, const float* x, int64_t n_rows, float* y) {
    check(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
          "matmul: dimension too large for cuBLAS");
    const int64_t x_elems = n_rows * w.n_in;
    // Freed (stream-ordered) however this ends.
    struct Temp {
      CudaBackend& be;
      ThreadCtx& c;
      void* p;
      ~Temp() { be.dev_free(c, p); }
    } xb{*this, c,
         dev_alloc(c, static_cast<size_t>(x_elems) * sizeof(__nv_bfloat16), "bf16 activations")};
    to_bf16_kernel<<<grid_for(x_elems), kEltThreads, 0, c.stream>>>(
        x, x_elems, static_cast<__nv_bfloat16*>(xb.p));
    launch_check("to_bf16_kernel");
    const int64_t slice = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmScratchBytes / sizeof(__nv_bfloat16)) / w.n_in, 1, w.n_out);
    auto* wb = static_cast<__nv_bfloat16*>(
        gemm_scratch(c, static_cast<size_t>(slice * w.n_in) * sizeof(__nv_bfloat16)));
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = blas(c);
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int64_t rows = std::min(slice, w.n_out - o0);
      dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0, rows, wb,
                                   c.stream);
      cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                static_cast<int>(n_rows), static_cast<int>(w.n_in), &one, wb,
                                CUDA_R_16BF, static_cast<int>(w.n_in), xb.p, CUDA_R_16BF,
                                static_cast<int>(w.n_in), &zero, y + o0, CUDA_R_32F,
                                static_cast<int>(w.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (bf16)");
    }
  }

  const int device_;
  const int gemv_max_rows_;
  bool zero_copy_ = false;
  bool prefetch_ = false;
  bool profile_ = false;     // CB_CUDA_PROFILE set: time every op
  bool round_bf16_ = false;  // CB_CUDA_BF16 set (not "0"): matmul_q8 rounds to bf16
  struct ProfileTotal {
    long long calls = 0;
    double ms = 0.0;
  };
  std::map<std::string, ProfileTotal> profile_totals_;  // under table_->mu
  cudaMemPool_t pool_ = nullptr;
  // table_->mu guards table_'s maps, ctxs_, owned_, staging_ and weights_.
  std::shared_ptr<CtxTable> table_;
  std::vector<std::unique_ptr<ThreadCtx>> ctxs_;
  std::map<uintptr_t, Block> owned_;  // start -> alloc_buffer / prepare_weight blocks
  std::unordered_set<void*> staging_;
  std::vector<void*> weights_;
};

// The plugin's entry points, reached through cb_cuda_plugin_api() (the core
// defines the functions of cuda_backend.h and forwards to these).
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_backend(int device, const CudaBackendOptions& opts) {
  const int n = device_count();
  if (device < 0 || device >= n) {
    fail(ErrorCode::kUnsupported, "cuda backend: no CUDA device " + std::to_string(device) + " (" +
                                      std::to_string(n) + " visible)");
  }
  return std::make_unique<CudaBackend>(device, opts);
}

CudaMark mark(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (cb == nullptr) fail(ErrorCode::kInvalidArgument, "cuda_mark: not a CUDA backend");
  return cb->mark();
}

double elapsed_ms(const CudaMark& from, const CudaMark& to) {
  if (!from || !to) fail(ErrorCode::kInvalidArgument, "cuda_elapsed_ms: empty mark");
  const cudaEvent_t a = from->ev, b = to->ev;
  cuda_check(cudaEventSynchronize(a), "cudaEventSynchronize");
  cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return ms;
}

}  // namespace
}  // namespace cb

extern "C" __attribute__((visibility("default"))) const cb::CudaPluginApi* cb_cuda_plugin_api() {
  static const cb::CudaPluginApi api{
      cb::kCudaPluginInterface, CB_PROJECT_VERSION, &cb::device_count,
      &cb::make_backend,        &cb::mark,          &cb::elapsed_ms};
  return &api;
}
