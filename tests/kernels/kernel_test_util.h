// Shared helpers for the kernel tests: random weights of every type, float64
// references, and error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/dequantize.h"
#include "platform/cpu_features.h"
#include "platform/error.h"
#include "platform/half.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "kernels/cpu/ops_avx2.h"
#elif defined(__aarch64__)
#include "kernels/cpu/ops_neon.h"
#endif

namespace cb::test {

inline constexpr DType kAllTypes[] = {DType::F32,  DType::F16,    DType::BF16,  DType::Q4_0,
                                      DType::Q4_1, DType::Q5_0,   DType::Q5_1,  DType::Q8_0,
                                      DType::Q4_K, DType::Q5_K,   DType::Q6_K,  DType::Q2_K,
                                      DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS};

inline bool avx2_available() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

// The SIMD kernel set this build and CPU can run: AVX2 on x86-64, NEON on
// AArch64 (null when there is none), so one test covers whichever exists.
struct SimdKernels {
  const char* name;  // as cpu_kernel_level_name() reports it
  CpuKernelLevel level;
  void (*matmul)(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
                 int64_t o_end);
  void (*attention_tile)(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                         int64_t h_end);
  void (*quantize_q8a)(const float* x, int64_t n, int8_t* qs, float* d, float* s);
  void (*gemv_q8)(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);
};

inline const SimdKernels* simd_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  static const SimdKernels k{"avx2",
                             CpuKernelLevel::kAvx2,
                             &avx2::matmul,
                             &avx2::attention_tile,
                             &avx2::quantize_q8a,
                             &avx2::gemv_q8};
  return avx2_available() ? &k : nullptr;
#elif defined(__aarch64__)
  static const SimdKernels k{"neon",
                             CpuKernelLevel::kNeon,
                             &neon::matmul,
                             &neon::attention_tile,
                             &neon::quantize_q8a,
                             &neon::gemv_q8};
  return cpu_features().neon ? &k : nullptr;
#else
  return nullptr;
#endif
}

inline bool avx512_available() {
  const CpuFeatures& f = cpu_features();
  return avx2_available() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
}

inline bool avx2_vnni_available() {
  return avx2_available() && cpu_features().avx_vnni;
}

inline bool neon_dotprod_available() {
  return cpu_features().neon && cpu_features().dotprod;
}

// The scalar level and, where there are, the SIMD levels, the best last
// (avx2-vnni and avx512 run the AVX2 kernels and neon-dotprod the NEON
// ones but for matmul_q8, so they are tested through the backend only).
inline std::vector<CpuKernelLevel> all_levels() {
  std::vector<CpuKernelLevel> l = {CpuKernelLevel::kScalar};
  if (const SimdKernels* k = simd_kernels()) l.push_back(k->level);
#if defined(__x86_64__) || defined(_M_X64)
  if (avx2_vnni_available()) l.push_back(CpuKernelLevel::kAvx2Vnni);
  if (avx512_available()) l.push_back(CpuKernelLevel::kAvx512);
#elif defined(__aarch64__)
  if (neon_dotprod_available()) l.push_back(CpuKernelLevel::kNeonDotprod);
#endif
  return l;
}

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight of n_out rows x n_in elements: random quant bytes with the f16
// scale fields set to magnitudes in [2^-10, 2^-3) so values stay moderate.
// fill >= 0: every quant byte is fill instead (0xFF: the largest quants).
inline std::vector<uint8_t> random_weight(std::mt19937& rng, DType t, int64_t n_out, int64_t n_in,
                                          int fill = -1) {
  const size_t bytes = dtype_row_bytes(t, n_in) * static_cast<size_t>(n_out);
  std::vector<uint8_t> data(bytes);
  const int64_t n = n_out * n_in;
  std::normal_distribution<float> normal(0.0f, 0.5f);
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        const float v = normal(rng);
        std::memcpy(data.data() + 4 * i, &v, 4);
      }
      return data;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const float v = normal(rng);
        const uint16_t h = t == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
        std::memcpy(data.data() + 2 * i, &h, 2);
      }
      return data;
    default:
      break;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(fill < 0 ? byte(rng) : fill);
  std::vector<size_t> scale_offsets;
  switch (t) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      scale_offsets = {0};
      break;
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
      scale_offsets = {0, 2};
      break;
    case DType::Q6_K:
      scale_offsets = {208};
      break;
    case DType::Q2_K:
      scale_offsets = {80, 82};
      break;
    case DType::Q3_K:
      scale_offsets = {108};
      break;
    default:
      break;
  }
  // The scales' f16 bits drawn as integers (sign, exponent 2^-10 .. 2^-4,
  // mantissa), so a quantized weight is the same bytes on every CPU and
  // compiler (float draws are not: libm and FMA contraction differ).
  std::uniform_int_distribution<int> exponent(5, 11), mantissa(0, 1023);
  const size_t block_bytes = dtype_block_bytes(t);
  for (size_t off = 0; off < bytes; off += block_bytes) {
    for (size_t s : scale_offsets) {
      const int sign = byte(rng) < 128 ? 0x8000 : 0;
      const int e = exponent(rng);
      const auto h = static_cast<uint16_t>(sign | e << 10 | mantissa(rng));
      std::memcpy(data.data() + off + s, &h, 2);
    }
  }
  return data;
}

inline std::vector<float> dequantize_all(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.n_out * w.n_in));
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  for (int64_t o = 0; o < w.n_out; ++o) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + o * row_bytes,
                   out.data() + o * w.n_in, w.n_in);
  }
  return out;
}

// y64[r][o] = sum_i W[o][i] x[r][i] in float64, and the matching scale
// sum_i |W[o][i] x[r][i]| that bounds any f32 summation error.
inline void matmul_f64(const std::vector<float>& wf, int64_t n_out, int64_t n_in, const float* x,
                       int64_t n_rows, std::vector<double>* y, std::vector<double>* abs_sum) {
  y->assign(static_cast<size_t>(n_rows * n_out), 0.0);
  abs_sum->assign(static_cast<size_t>(n_rows * n_out), 0.0);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0.0, a = 0.0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double p = static_cast<double>(wf[o * n_in + i]) * x[r * n_in + i];
        s += p;
        a += std::fabs(p);
      }
      (*y)[r * n_out + o] = s;
      (*abs_sum)[r * n_out + o] = a;
    }
  }
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace cb::test
