// The int8 GEMV of decode (Backend::matmul_q8): activation quantization,
// the scalar reference against float64, the SIMD kernels against the
// reference, and the backend path.
//
// Tolerances, and why they can fail:
//  * Quantization: SIMD and reference produce the same bytes (exact), and
//    every element is within d / 2 of x (round to nearest).
//  * The reference, given quantized activations, computes
//    sum_i w_i * (xq_i * d): the integer parts are exact, so its only error
//    is f32 rounding of the per-block terms and their running sum, bounded
//    by 1e-5 * sum_i |w_i * xq_i * d| at these lengths (see test_matmul.cpp).
//    A wrong nibble order, scale or offset is an error of order one block's
//    share, i.e. ~1/n_blocks of that sum, far above the bound.
//  * SIMD vs reference: both within that bound of the float64 value, so
//    within twice the bound of each other.
//  * Against the f32 matmul (unquantized activations): at most
//    sum_i |w_i| * d_i / 2 apart (each activation moved by at most d / 2),
//    plus the f32 rounding bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/ops_avx512.h"
#endif

namespace cb {
namespace {

constexpr DType kQ8Types[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,
                              DType::Q8_0, DType::Q2_K, DType::Q3_K,   DType::Q4_K,
                              DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

// Activations like a model's: mostly small, a few large outliers (which set
// a block's scale), some exact zeros and one all-zero block.
std::vector<float> activations(std::mt19937& rng, int64_t n) {
  std::vector<float> x = test::random_floats(rng, n);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int i = 0; i < 4; ++i) x[static_cast<size_t>(pick(rng))] *= 40.0f;
  for (int i = 0; i < 4; ++i) x[static_cast<size_t>(pick(rng))] = 0.0f;
  if (n >= 64)
    for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;
  return x;
}

// A quantized activation row and the arrays behind it.
struct Q8Act {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  explicit Q8Act(size_t n) : qs(n), d(n / 32), s(n / 32) {}
  Q8Row view() const { return {qs.data(), d.data(), s.data()}; }
};

Q8Act quantize(const std::vector<float>& x, void (*quantizer)(const float*, int64_t, int8_t*,
                                                              float*, float*) = ref::quantize_q8a) {
  Q8Act q(x.size());
  quantizer(x.data(), static_cast<int64_t>(x.size()), q.qs.data(), q.d.data(), q.s.data());
  return q;
}

std::vector<float> dequantize(const Q8Act& q) {
  std::vector<float> x(q.qs.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(q.qs[i]) * q.d[i / 32];
  return x;
}

std::vector<int64_t> n_in_cases(DType t) {
  return dtype_block_elems(t) == 32 ? std::vector<int64_t>{32, 96, 576, 1568}
                                    : std::vector<int64_t>{256, 768, 1792};
}

TEST(GemvQ8, QuantizeRoundsToNearestAndSimdGivesSameBytes) {
  std::mt19937 rng(11);
  const test::SimdKernels* simd = test::simd_kernels();
  for (int64_t n : {32, 64, 576, 1536}) {
    const std::vector<float> x = activations(rng, n);
    const Q8Act q = quantize(x);
    for (size_t b = 0; b < q.d.size(); ++b) {
      float amax = 0.0f;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const int qi = q.qs[b * 32 + i];
        sum += qi;
        ASSERT_LE(std::abs(qi), 127);
        // Round to nearest: within half a step (plus f32 rounding of x / d).
        EXPECT_LE(std::fabs(x[b * 32 + i] - qi * q.d[b]), q.d[b] * (0.5f + 1e-5f) + 1e-30f)
            << "n=" << n << " block " << b << " element " << i;
      }
      EXPECT_EQ(q.d[b], amax / 127.0f);
      EXPECT_EQ(q.s[b], q.d[b] * static_cast<float>(sum));
    }
    if (simd != nullptr) {
      const Q8Act qs = quantize(x, simd->quantize_q8a);
      EXPECT_TRUE(qs.qs == q.qs && qs.d == q.d && qs.s == q.s) << simd->name << " n=" << n;
    }
  }
}

// The word-parallel unpacking of Q4_K / Q5_K scales and mins gives
// q4k_scale_min's values for every byte pattern position.
TEST(GemvQ8, Q4kScalesMinsMatchesOneAtATime) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t scales[12];
    for (uint8_t& b : scales) b = static_cast<uint8_t>(rng());
    uint64_t sc8, m8;
    q4k_scales_mins(scales, &sc8, &m8);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4k_scale_min(scales, j, &sc, &m);
      ASSERT_EQ((sc8 >> (8 * j)) & 0xFF, sc) << "sub-block " << j;
      ASSERT_EQ((m8 >> (8 * j)) & 0xFF, m) << "sub-block " << j;
    }
  }
}

// ref::gemv_q8 is the product of the dequantized weight and the
// dequantized activations, up to f32 rounding.
TEST(GemvQ8, ReferenceMatchesFloat64OfQuantizedActivations) {
  std::mt19937 rng(12);
  for (DType t : kQ8Types) {
    ASSERT_TRUE(ref::gemv_q8_supported(t));
    for (int64_t n_in : n_in_cases(t)) {
      const int64_t n_out = 9;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      const Q8Act xq = quantize(activations(rng, n_in));
      const std::vector<float> xd = dequantize(xq);
      std::vector<double> exact, abs_sum;
      test::matmul_f64(test::dequantize_all(w), n_out, n_in, xd.data(), 1, &exact, &abs_sum);
      std::vector<float> y(n_out);
      ref::gemv_q8(w, xq.view(), y.data(), 0, n_out);
      for (int64_t o = 0; o < n_out; ++o)
        EXPECT_NEAR(y[o], exact[o], 1e-5 * abs_sum[o] + 1e-30)
            << dtype_name(t) << " n_in=" << n_in << " o=" << o;
    }
  }
  EXPECT_FALSE(ref::gemv_q8_supported(DType::F16));
  EXPECT_FALSE(ref::gemv_q8_supported(DType::F32));
}

using GemvQ8Fn = void (*)(const WeightView&, const Q8Row&, float*, int64_t, int64_t);

// Every SIMD GEMV this build and CPU can run: simd_kernels()'s, and the
// avx512 level's own (its K-quant rows differ from avx2's).
std::vector<std::pair<std::string, GemvQ8Fn>> simd_gemvs() {
  std::vector<std::pair<std::string, GemvQ8Fn>> g;
  if (const test::SimdKernels* simd = test::simd_kernels())
    g.emplace_back(simd->name, simd->gemv_q8);
#if defined(__x86_64__) || defined(_M_X64)
  if (test::avx512_available()) g.emplace_back("avx512", &avx512::gemv_q8);
#endif
  return g;
}

TEST(GemvQ8, SimdMatchesReference) {
  const auto gemvs = simd_gemvs();
  if (gemvs.empty()) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(13);
  for (DType t : kQ8Types) {
    for (int64_t n_in : n_in_cases(t)) {
      for (int64_t n_out : {1, 7, 193}) {
        std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
        const WeightView w{wd.data(), t, n_in, n_out};
        const Q8Act xq = quantize(activations(rng, n_in));
        const std::vector<float> xd = dequantize(xq);
        std::vector<double> exact, abs_sum;
        test::matmul_f64(test::dequantize_all(w), n_out, n_in, xd.data(), 1, &exact, &abs_sum);
        std::vector<float> y_ref(n_out);
        ref::gemv_q8(w, xq.view(), y_ref.data(), 0, n_out);
        for (const auto& [name, gemv] : gemvs) {
          std::vector<float> y_simd(n_out, NAN);
          const int64_t cut = n_out / 3;  // two uneven slices, as threads get them
          gemv(w, xq.view(), y_simd.data(), 0, cut);
          gemv(w, xq.view(), y_simd.data(), cut, n_out);
          for (int64_t o = 0; o < n_out; ++o) {
            EXPECT_NEAR(y_simd[o], y_ref[o], 2e-5 * abs_sum[o] + 1e-30)
                << name << " " << dtype_name(t) << " n_in=" << n_in << " o=" << o;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
}

// Through the backend at every level and thread count: within the
// activation-rounding bound of the exact f32 product, and the same bits
// whatever the thread count.
TEST(GemvQ8, BackendWithinRoundingBoundOfF32Matmul) {
  std::mt19937 rng(14);
  for (CpuKernelLevel level : test::all_levels()) {
    for (DType t : kQ8Types) {
      const int64_t n_in = dtype_block_elems(t) == 32 ? 576 : 768, n_out = 193;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      const std::vector<float> wf = test::dequantize_all(w);
      // 1 and 3 rows: the GEMV; 17 and 40: the int8 GEMM where the level
      // has one for the type (avx512, avx2), else the exact GEMM.
      for (int64_t n_rows : {1, 3, 17, 40}) {
        const std::vector<float> x = activations(rng, n_rows * n_in);
        const Q8Act xq = quantize(x);
        std::vector<double> exact, abs_sum;
        test::matmul_f64(wf, n_out, n_in, x.data(), n_rows, &exact, &abs_sum);
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          auto be = make_cpu_backend(threads, level);
          std::vector<float> y(n_rows * n_out);
          be->matmul_q8(w, x.data(), n_rows, y.data());
          if (threads == 1) {
            first = y;
          } else {
            EXPECT_TRUE(test::bitwise_equal(y, first)) << dtype_name(t) << " threads=" << threads;
          }
        }
        for (int64_t r = 0; r < n_rows; ++r) {
          for (int64_t o = 0; o < n_out; ++o) {
            double bound = 2e-5 * abs_sum[r * n_out + o];
            for (int64_t i = 0; i < n_in; ++i)
              bound += std::fabs(wf[o * n_in + i]) * 0.5 * xq.d[(r * n_in + i) / 32];
            EXPECT_NEAR(first[r * n_out + o], exact[r * n_out + o], bound)
                << dtype_name(t) << " row " << r << " o=" << o;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
}

// The levels with an int8 GEMM (avx512, avx2-vnni, avx2, neon-dotprod) on this CPU,
// and whether a level has it for type t (else many rows take the exact
// matmul).
std::vector<CpuKernelLevel> int8_gemm_levels() {
  std::vector<CpuKernelLevel> l;
#if defined(__x86_64__) || defined(_M_X64)
  if (test::avx512_available()) l.push_back(CpuKernelLevel::kAvx512);
  if (test::avx2_vnni_available()) l.push_back(CpuKernelLevel::kAvx2Vnni);
  if (test::avx2_available()) l.push_back(CpuKernelLevel::kAvx2);
#elif defined(__aarch64__)
  if (test::neon_dotprod_available()) l.push_back(CpuKernelLevel::kNeonDotprod);
#endif
  return l;
}
bool has_int8_gemm(CpuKernelLevel level, DType t) {
#if defined(__x86_64__) || defined(_M_X64)
  if (level == CpuKernelLevel::kAvx512) return avx512::gemm_q8_supported(t);
  if (level == CpuKernelLevel::kAvx2) return avx2::gemm_q8_supported(t);
  if (level == CpuKernelLevel::kAvx2Vnni) return avxvnni::gemm_q8_supported(t);
#elif defined(__aarch64__)
  if (level == CpuKernelLevel::kNeonDotprod) return neon::gemm_q8_supported(t);
#endif
  (void)level;
  (void)t;
  return false;
}

// Each weight's value at quant 0, as the int8 kernels read the quants
// (unsigned, w = scale * q + off): its group's offset.  The weight with
// every quant field set to 0 (Q8_0's to -128, as the GEMM shifts them),
// dequantized.
std::vector<float> quant_zero_values(const WeightView& w) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const auto* src = static_cast<const uint8_t*>(w.data);
  std::vector<uint8_t> z(src, src + row_bytes * static_cast<size_t>(w.n_out));
  const size_t block = dtype_block_bytes(w.type);
  const auto fill = [&](size_t offset, size_t n, uint8_t v = 0) {
    for (size_t b = 0; b < z.size(); b += block) std::memset(z.data() + b + offset, v, n);
  };
#define CB_FILL(Block, field, ...) fill(offsetof(Block, field), sizeof(Block::field), ##__VA_ARGS__)
  switch (w.type) {
    case DType::Q4_0:
      CB_FILL(BlockQ4_0, qs);
      break;
    case DType::Q4_1:
      CB_FILL(BlockQ4_1, qs);
      break;
    case DType::Q5_0:
      CB_FILL(BlockQ5_0, qs);
      CB_FILL(BlockQ5_0, qh);
      break;
    case DType::Q5_1:
      CB_FILL(BlockQ5_1, qs);
      CB_FILL(BlockQ5_1, qh);
      break;
    case DType::Q8_0:
      CB_FILL(BlockQ8_0, qs, 0x80);
      break;
    case DType::Q2_K:
      CB_FILL(BlockQ2_K, qs);
      break;
    case DType::Q3_K:
      CB_FILL(BlockQ3_K, qs);
      CB_FILL(BlockQ3_K, hmask);
      break;
    case DType::Q4_K:
      CB_FILL(BlockQ4_K, qs);
      break;
    case DType::Q5_K:
      CB_FILL(BlockQ5_K, qs);
      CB_FILL(BlockQ5_K, qh);
      break;
    case DType::Q6_K:
      CB_FILL(BlockQ6_K, ql);
      CB_FILL(BlockQ6_K, qh);
      break;
    case DType::IQ4_NL:
      CB_FILL(BlockIQ4_NL, qs);
      break;
    case DType::IQ4_XS:
      CB_FILL(BlockIQ4_XS, qs);
      break;
    default:
      break;
  }
#undef CB_FILL
  return test::dequantize_all(WeightView{z.data(), w.type, w.n_in, w.n_out});
}

// The int8 GEMV (1 and 3 rows) and GEMM (7 and 40 rows) of the levels that
// have both are the product of the dequantized weight and the dequantized
// activations up to f32 rounding: uneven panels (5 and 193 columns),
// partial micro-kernel row blocks, and rows longer than one k-block (2304
// elements).  The kernels sum scale * sum(q x) and off * sum(x) per group,
// each up to sum |w x| + sum |off x| in size, so they round on that scale
// where the two nearly cancel: the bound is 2e-5 * (sum |w x| +
// 2 sum |off x|), which the scalar reference too needs: in 300 random
// cases of 3 rows, 2e-5 * sum |w x| was exceeded in 1 of Q4_1 by the
// reference and in 6 of Q4_0, Q4_1 and Q5_0 by the x86 GEMV (by up to
// 14x), while the worst error at any level was 2.3e-7 of the wider scale.
TEST(GemvQ8, Int8MatchesFloat64OfQuantizedActivations) {
  if (int8_gemm_levels().empty()) GTEST_SKIP() << "no int8 GEMM on this CPU";
  for (CpuKernelLevel level : int8_gemm_levels()) {
    std::mt19937 rng(16);  // every level the same cases, whichever levels the CPU has
    auto be = make_cpu_backend(2, level);
    for (DType t : kQ8Types) {
      for (int64_t n_in :
           {dtype_block_elems(t) == 32 ? int64_t{96} : int64_t{256}, int64_t{2304}}) {
        for (auto [n_out, n_rows] :
             {std::pair<int64_t, int64_t>{5, 40}, {193, 7}, {5, 1}, {193, 3}}) {
          if (n_rows > 4 && !has_int8_gemm(level, t)) continue;
          std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
          const WeightView w{wd.data(), t, n_in, n_out};
          const std::vector<float> x = activations(rng, n_rows * n_in);
          const std::vector<float> xd = dequantize(quantize(x));
          std::vector<double> exact, abs_sum;
          test::matmul_f64(test::dequantize_all(w), n_out, n_in, xd.data(), n_rows, &exact,
                           &abs_sum);
          std::vector<double> off_exact, off_sum;  // sum |off x|, from the |x|
          std::vector<float> ax(xd.size());
          for (size_t i = 0; i < xd.size(); ++i) ax[i] = std::fabs(xd[i]);
          std::vector<float> offs = quant_zero_values(w);
          for (float& v : offs) v = std::fabs(v);
          test::matmul_f64(offs, n_out, n_in, ax.data(), n_rows, &off_exact, &off_sum);
          std::vector<float> y(n_rows * n_out, NAN);
          be->matmul_q8(w, x.data(), n_rows, y.data());
          for (int64_t i = 0; i < n_rows * n_out; ++i)
            ASSERT_NEAR(y[i], exact[i], 2e-5 * (abs_sum[i] + 2 * off_sum[i]) + 1e-30)
                << be->name() << " " << dtype_name(t) << " n_in=" << n_in << " n_out=" << n_out
                << " row " << i / n_out << " o=" << i % n_out;
        }
      }
    }
  }
}

// The int8 GEMM at its extremes: every quant at its largest and every
// activation at +-127 (rows of +1, of -1, and alternating), where the avx2
// kernel's 16-bit pair sums come closest to saturating.  Every level's
// GEMM gives the same bits.
TEST(GemvQ8, Int8GemmLargestQuantsAndActivations) {
  if (int8_gemm_levels().empty()) GTEST_SKIP() << "no int8 GEMM on this CPU";
  std::mt19937 rng(17);
  const int64_t n_out = 37, n_rows = 9;
  for (DType t : kQ8Types) {
    const int64_t n_in = dtype_block_elems(t) == 32 ? 384 : 512;
    std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in, 0xFF);
    const WeightView w{wd.data(), t, n_in, n_out};
    std::vector<float> x(n_rows * n_in);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < n_in; ++i)
        x[r * n_in + i] = r % 3 == 0 ? 1.0f : r % 3 == 1 ? -1.0f : (i % 2 == 0 ? 1.0f : -1.0f);
    const std::vector<float> xd = dequantize(quantize(x));
    std::vector<double> exact, abs_sum;
    test::matmul_f64(test::dequantize_all(w), n_out, n_in, xd.data(), n_rows, &exact, &abs_sum);
    std::vector<std::vector<float>> results;
    for (CpuKernelLevel level : int8_gemm_levels()) {
      if (!has_int8_gemm(level, t)) continue;
      auto be = make_cpu_backend(2, level);
      std::vector<float> y(n_rows * n_out, NAN);
      be->matmul_q8(w, x.data(), n_rows, y.data());
      for (int64_t i = 0; i < n_rows * n_out; ++i)
        ASSERT_NEAR(y[i], exact[i], 2e-5 * abs_sum[i] + 1e-30)
            << be->name() << " " << dtype_name(t) << " row " << i / n_out << " o=" << i % n_out;
      results.push_back(y);
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(test::bitwise_equal(results[0], results[i])) << dtype_name(t) << " level " << i;
    }
  }
}

// Every int8 GEMM gives the same bits on every instruction set: the
// AVX-512, AVX2 and SDOT kernels sum each group exactly in int32 and apply
// the same f32 operations in the same order.  Levels on different CPUs
// cannot meet in one process, so each level's output is compared with the
// FNV-1a hash of the float bits the x86 levels give (AVX-512 and AVX2
// agree on every type both have; Q8_0 and the IQ4 types have an int8 GEMM
// only with AVX-512).  A change that moves these bits on purpose records
// the new hashes here (print `hash`); one that moves them on one
// instruction set only is a bug of that kernel.
TEST(GemvQ8, Int8GemmGivesTheSameBitsOnEveryInstructionSet) {
  if (int8_gemm_levels().empty()) GTEST_SKIP() << "no int8 GEMM on this CPU";
  const std::pair<DType, uint64_t> kExpected[] = {
      {DType::Q8_0, 0x685661f7f4a7fd94},   {DType::Q4_0, 0x3ae6c87ae0f012ea},
      {DType::Q4_1, 0x94e52b4c8af94e9a},   {DType::Q5_0, 0x3999cbf3a50a1b1b},
      {DType::Q5_1, 0xbb2a63bdc1a6083c},   {DType::Q2_K, 0x17dde19f5178a1c4},
      {DType::Q3_K, 0xf52c880c29220bd7},   {DType::Q4_K, 0xa5f221594a331a7b},
      {DType::Q5_K, 0x90c0259f9db479bb},   {DType::Q6_K, 0x32d57905095509f3},
      {DType::IQ4_NL, 0x1b31eca9b6c9592e}, {DType::IQ4_XS, 0x8dfff5375d799842}};
  // 37 rows: six micro-kernel row blocks and a partial one at every level;
  // 300 columns: a partial panel; 2304 elements: two k-blocks.
  const int64_t n_in = 2304, n_out = 300, n_rows = 37;
  for (CpuKernelLevel level : int8_gemm_levels()) {
    auto be = make_cpu_backend(2, level);
    for (const auto& [t, expected] : kExpected) {
      if (!has_int8_gemm(level, t)) continue;
      std::mt19937 rng(5);
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      // Activations in [-2, 2] in steps of 2^-10, drawn as integers: the
      // same floats on every CPU and compiler.
      std::uniform_int_distribution<int> step(-2048, 2048);
      std::vector<float> x(n_rows * n_in);
      for (float& v : x) v = static_cast<float>(step(rng)) / 1024.0f;
      std::vector<float> y(n_rows * n_out);
      be->matmul_q8(w, x.data(), n_rows, y.data());
      uint64_t hash = 1469598103934665603ull;
      for (float f : y) {
        uint32_t u;
        std::memcpy(&u, &f, sizeof u);
        hash = (hash ^ u) * 1099511628211ull;
      }
      EXPECT_EQ(hash, expected) << be->name() << " " << dtype_name(t) << ": 0x" << std::hex << hash;
    }
  }
}

// The SDOT GEMV of the neon-dotprod level gives the baseline NEON GEMV's
// bits: the same exact block sums, the same f32 operations after them.
TEST(GemvQ8, DotprodGemvGivesTheNeonBits) {
#if defined(__aarch64__)
  if (!test::neon_dotprod_available()) GTEST_SKIP() << "no dot-product extension on this CPU";
  auto neon = make_cpu_backend(2, CpuKernelLevel::kNeon);
  auto dotprod = make_cpu_backend(2, CpuKernelLevel::kNeonDotprod);
  std::mt19937 rng(18);
  for (DType t : kQ8Types) {
    for (int64_t n_rows : {1, 4}) {
      const int64_t n_in = 2304, n_out = 67;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
      std::vector<float> a(n_rows * n_out), b(n_rows * n_out);
      neon->matmul_q8(w, x.data(), n_rows, a.data());
      dotprod->matmul_q8(w, x.data(), n_rows, b.data());
      EXPECT_TRUE(test::bitwise_equal(a, b)) << dtype_name(t) << " rows=" << n_rows;
    }
  }
#else
  GTEST_SKIP() << "the Arm levels only";
#endif
}

// Weight types without an int8 kernel, and batches beyond a few rows at the
// levels without an int8 GEMM, take the exact matmul: the same bits as
// matmul().
TEST(GemvQ8, FallsBackToMatmulWhereThereIsNoInt8Path) {
  std::mt19937 rng(15);
  for (CpuKernelLevel level : test::all_levels()) {
    auto be = make_cpu_backend(2, level);
    for (auto [t, n_rows] :
         {std::pair{DType::F16, int64_t{1}}, std::pair{DType::BF16, int64_t{1}},
          std::pair{DType::F16, int64_t{17}}, std::pair{DType::Q4_1, int64_t{17}},
          std::pair{DType::Q8_0, int64_t{17}}}) {
      if (n_rows > 4 && has_int8_gemm(level, t)) continue;
      const int64_t n_in = 256, n_out = 40;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
      std::vector<float> a(n_rows * n_out), b(n_rows * n_out);
      be->matmul(w, x.data(), n_rows, a.data());
      be->matmul_q8(w, x.data(), n_rows, b.data());
      EXPECT_TRUE(test::bitwise_equal(a, b)) << dtype_name(t) << " rows=" << n_rows;
    }
  }
}

}  // namespace
}  // namespace cb
