// matmul: the scalar reference against a float64 loop, the SIMD kernels
// (AVX2 or NEON) against the reference, and thread-count independence of the
// backend.  Shapes cover odd lengths and tails: n_in not a multiple of the
// SIMD width, n_in long enough to be cut into unequal k-blocks (> 768),
// n_out not a multiple of the 16-column panels, and row counts that leave
// partial 6-row micro-tiles.
//
// Tolerance: |y - y_exact| <= 1e-5 * sum_i |w_i x_i|.  An f32 dot product of
// n terms has a worst-case error of about n * 6e-8 times that sum and a
// typical one of sqrt(n) * 6e-8 (< 3e-6 for the n <= 1792 used here); a wrong
// or missing block shows up at ~1/n of the sum, far above the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"

namespace cb {
namespace {

using test::kAllTypes;

constexpr double kRelTol = 1e-5;

std::vector<int64_t> n_in_cases(DType t) {
  switch (dtype_block_elems(t)) {
    case 1:
      return {1, 13, 40, 300, 1001};  // odd lengths exercise the scalar tails
    case 32:
      return {32, 96, 576, 1568};
    default:
      return {256, 768, 1792};
  }
}

void expect_close(const std::vector<float>& y, const std::vector<double>& exact,
                  const std::vector<double>& abs_sum, const std::string& what) {
  ASSERT_EQ(y.size(), exact.size());
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(static_cast<double>(y[i]) - exact[i]);
    if (!(err <= kRelTol * abs_sum[i] + 1e-30) && ++bad <= 3) {
      ADD_FAILURE() << what << " index " << i << ": " << y[i] << " vs " << exact[i] << " (scale "
                    << abs_sum[i] << ")";
    }
  }
}

TEST(Matmul, ReferenceMatchesFloat64) {
  std::mt19937 rng(1);
  for (DType t : kAllTypes) {
    for (int64_t n_in : n_in_cases(t)) {
      const int64_t n_out = 7, n_rows = 3;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
      std::vector<double> exact, abs_sum;
      test::matmul_f64(test::dequantize_all(w), n_out, n_in, x.data(), n_rows, &exact, &abs_sum);
      std::vector<float> y(n_rows * n_out);
      ref::matmul(w, x.data(), n_rows, y.data());
      expect_close(y, exact, abs_sum, std::string(dtype_name(t)) + " n_in=" + std::to_string(n_in));
    }
  }
}

TEST(Matmul, SimdMatchesReferenceAndFloat64) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(2);
  for (DType t : kAllTypes) {
    for (int64_t n_in : n_in_cases(t)) {
      for (int64_t n_out : {1, 7, 193}) {
        std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
        const WeightView w{wd.data(), t, n_in, n_out};
        const std::vector<float> wf = test::dequantize_all(w);
        for (int64_t n_rows : {1, 3, 17, 64}) {
          const std::string what = std::string(dtype_name(t)) + " n_in=" + std::to_string(n_in) +
                                   " n_out=" + std::to_string(n_out) +
                                   " n_rows=" + std::to_string(n_rows);
          const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
          std::vector<double> exact, abs_sum;
          test::matmul_f64(wf, n_out, n_in, x.data(), n_rows, &exact, &abs_sum);
          std::vector<float> y_ref(n_rows * n_out), y_fast(n_rows * n_out, NAN);
          ref::matmul(w, x.data(), n_rows, y_ref.data());
          // Two uneven column slices, as the backend would hand to threads.
          const int64_t cut = n_out / 3;
          simd->matmul(w, x.data(), n_rows, y_fast.data(), 0, cut);
          simd->matmul(w, x.data(), n_rows, y_fast.data(), cut, n_out);
          expect_close(y_fast, exact, abs_sum, what + " simd vs f64");
          std::vector<double> ref_as_exact(y_ref.begin(), y_ref.end());
          // Both are within 1e-5 of exact, so within 2e-5 of each other.
          for (double& s : abs_sum) s *= 2.0;
          expect_close(y_fast, ref_as_exact, abs_sum, what + " simd vs ref");
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The backend splits by output column; every column is computed the same
// way whatever the split, so results must be bit-identical for any thread
// count, at both kernel levels, for GEMV and GEMM alike.
TEST(Matmul, BackendIndependentOfThreadCount) {
  std::mt19937 rng(3);
  for (CpuKernelLevel level : test::all_levels()) {
    for (DType t : {DType::Q4_1, DType::Q6_K, DType::F16}) {
      const int64_t n_in = 512, n_out = 193;
      std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
      const WeightView w{wd.data(), t, n_in, n_out};
      for (int64_t n_rows : {1, 17}) {
        const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          auto be = make_cpu_backend(threads, level);
          std::vector<float> y(n_rows * n_out);
          be->matmul(w, x.data(), n_rows, y.data());
          if (threads == 1) {
            first = y;
            if (level == CpuKernelLevel::kScalar) {
              std::vector<float> y_ref(y.size());
              ref::matmul(w, x.data(), n_rows, y_ref.data());
              EXPECT_TRUE(test::bitwise_equal(y, y_ref)) << "scalar backend is the reference";
            }
          } else {
            EXPECT_TRUE(test::bitwise_equal(y, first))
                << dtype_name(t) << " rows=" << n_rows << " threads=" << threads;
          }
        }
      }
    }
  }
}

// A model-sized shape through the backend, to exercise whole tiles and the
// per-thread buffers.
TEST(Matmul, ModelShapeQ4_1) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(4);
  const int64_t n_in = 576, n_out = 1536, n_rows = 40;
  std::vector<uint8_t> wd = test::random_weight(rng, DType::Q4_1, n_out, n_in);
  const WeightView w{wd.data(), DType::Q4_1, n_in, n_out};
  const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
  std::vector<double> exact, abs_sum;
  test::matmul_f64(test::dequantize_all(w), n_out, n_in, x.data(), n_rows, &exact, &abs_sum);
  auto be = make_cpu_backend(2, simd->level);
  std::vector<float> y(n_rows * n_out);
  be->matmul(w, x.data(), n_rows, y.data());
  expect_close(y, exact, abs_sum, "gemm");
  be->matmul(w, x.data(), 1, y.data());
  exact.resize(n_out);
  abs_sum.resize(n_out);
  y.resize(n_out);
  expect_close(y, exact, abs_sum, "gemv");
}

TEST(Matmul, RejectsPartialBlocks) {
  auto be = make_cpu_backend(1, CpuKernelLevel::kScalar);
  std::vector<uint8_t> wd(1024);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(be->matmul(WeightView{wd.data(), DType::Q4_0, 48, 1}, x.data(), 1, y.data()), Error);
}

}  // namespace
}  // namespace cb
