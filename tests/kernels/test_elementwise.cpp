// rmsnorm, silu_mul, gelu_mul, scale, add, segment_means, gather/scatter and
// get_rows at both kernel levels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"
#include "platform/error.h"

namespace cb {
namespace {

std::vector<CpuKernelLevel> levels() {
  return test::all_levels();
}

// Tolerance 1e-5 relative: the f32 sum of squares of `dim` positive terms is
// off by at most dim * 6e-8 (3.5e-5 at 576, typically ~1e-6), halved by the
// square root, plus two roundings in x * scale * w.
TEST(RmsNorm, MatchesFloat64) {
  std::mt19937 rng(31);
  for (CpuKernelLevel level : levels()) {
    for (int threads : {1, 2, 3}) {
      auto be = make_cpu_backend(threads, level);
      for (int64_t dim : {1, 7, 64, 576, 1000}) {
        const int64_t n_rows = 5;
        const std::vector<float> x = test::random_floats(rng, n_rows * dim, 3.0f);
        const std::vector<float> w = test::random_floats(rng, dim);
        std::vector<float> y(x.size());
        const float eps = 1e-5f;
        be->rmsnorm(x.data(), w.data(), n_rows, dim, eps, y.data());
        for (int64_t r = 0; r < n_rows; ++r) {
          double ss = 0.0;
          for (int64_t i = 0; i < dim; ++i)
            ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
          const double scale = 1.0 / std::sqrt(ss / dim + eps);
          for (int64_t i = 0; i < dim; ++i) {
            const double want = x[r * dim + i] * scale * w[i];
            ASSERT_NEAR(y[r * dim + i], want, 1e-5 * std::fabs(want) + 1e-30)
                << "dim " << dim << " level " << static_cast<int>(level);
          }
        }
      }
    }
  }
}

// silu(g) * u against float64.  1e-6 relative covers the f32 division and
// the ~1e-7 polynomial exp; below 1e-30 in magnitude only the absolute
// error matters (the AVX2 exp saturates at e^87.3).
TEST(SiluMul, MatchesFloat64) {
  std::mt19937 rng(32);
  for (CpuKernelLevel level : levels()) {
    auto be = make_cpu_backend(2, level);
    for (int64_t n : {1, 7, 8, 1536, 100003}) {
      std::vector<float> g = test::random_floats(rng, n, 4.0f);
      const std::vector<float> u = test::random_floats(rng, n);
      const float extremes[] = {0.0f, -100.0f, 100.0f, -20.0f, 20.0f, 1e-20f};
      for (size_t i = 0; i < 6 && i < g.size(); ++i) g[i] = extremes[i];
      std::vector<float> out(n);
      be->silu_mul(g.data(), u.data(), n, out.data());
      // In place on gate (as the graph runs it): the same bits.
      std::vector<float> in_place = g;
      be->silu_mul(in_place.data(), u.data(), n, in_place.data());
      ASSERT_EQ(std::memcmp(in_place.data(), out.data(), out.size() * sizeof(float)), 0);
      for (int64_t i = 0; i < n; ++i) {
        const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        ASSERT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g=" << g[i];
      }
    }
  }
}

// gelu(g) * u (tanh form) against float64, as silu_mul.
TEST(GeluMul, MatchesFloat64) {
  std::mt19937 rng(34);
  for (CpuKernelLevel level : levels()) {
    auto be = make_cpu_backend(2, level);
    for (int64_t n : {1, 7, 8, 2048, 100003}) {
      std::vector<float> g = test::random_floats(rng, n, 4.0f);
      const std::vector<float> u = test::random_floats(rng, n);
      const float extremes[] = {0.0f, -100.0f, 100.0f, -6.0f, 6.0f, 1e-20f};
      for (size_t i = 0; i < 6 && i < g.size(); ++i) g[i] = extremes[i];
      std::vector<float> out(n);
      be->gelu_mul(g.data(), u.data(), n, out.data());
      // In place on gate (as the graph runs it): the same bits.
      std::vector<float> in_place = g;
      be->gelu_mul(in_place.data(), u.data(), n, in_place.data());
      ASSERT_EQ(std::memcmp(in_place.data(), out.data(), out.size() * sizeof(float)), 0);
      for (int64_t i = 0; i < n; ++i) {
        // x / 2 (1 + tanh(v)) = x / (1 + e^(-2v)); the first cancels for x << 0.
        const double x = g[i];
        const double v = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        const double want = x / (1.0 + std::exp(-2.0 * v)) * u[i];
        // The exponent 2v is rounded in f32: the relative error grows with it.
        const double tol = 2e-7 * (8.0 + std::fabs(2.0 * v)) * std::fabs(want) + 1e-30;
        ASSERT_NEAR(out[i], want, tol) << "g=" << g[i];
      }
    }
  }
}

TEST(Scale, MultipliesInPlace) {
  std::mt19937 rng(35);
  for (CpuKernelLevel level : levels()) {
    auto be = make_cpu_backend(2, level);
    std::vector<float> x = test::random_floats(rng, 1001);
    std::vector<float> want = x;
    for (float& v : want) v *= 25.3f;
    be->scale(x.data(), static_cast<int64_t>(x.size()), 25.3f);
    EXPECT_TRUE(test::bitwise_equal(x, want));
  }
}

TEST(Add, ExactAndAliasing) {
  std::mt19937 rng(33);
  for (CpuKernelLevel level : levels()) {
    auto be = make_cpu_backend(3, level);
    for (int64_t n : {1, 9, 576, 200001}) {
      const std::vector<float> a = test::random_floats(rng, n), b = test::random_floats(rng, n);
      std::vector<float> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
      std::vector<float> out(n);
      be->add(a.data(), b.data(), n, out.data());
      EXPECT_TRUE(test::bitwise_equal(out, want));
      std::vector<float> in_place = a;  // out aliases a (the residual update)
      be->add(in_place.data(), b.data(), n, in_place.data());
      EXPECT_TRUE(test::bitwise_equal(in_place, want));
      in_place = b;  // out aliases b
      be->add(a.data(), in_place.data(), n, in_place.data());
      EXPECT_TRUE(test::bitwise_equal(in_place, want));
    }
  }
}

TEST(AddBias, EveryRowExactly) {
  std::mt19937 rng(35);
  for (CpuKernelLevel level : levels()) {
    auto be = make_cpu_backend(3, level);
    for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 7}, {5, 96}, {700, 130}}) {
      const std::vector<float> x = test::random_floats(rng, rows * dim);
      const std::vector<float> bias = test::random_floats(rng, dim);
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] + bias[i];
      std::vector<float> out = x;
      be->add_bias(out.data(), bias.data(), rows, dim);
      EXPECT_TRUE(test::bitwise_equal(out, want)) << rows << " x " << dim;
    }
  }
}

// Each level's one pass gives the bits of Backend's default (add, gather
// and scale in the contract's order), on segments of 1, 2, odd and many
// rows, whatever the thread count; within f32 rounding of a float64 mean.
TEST(SegmentMeans, TheDefaultsBitsAndNearTheMean) {
  std::mt19937 rng(36);
  const std::vector<int32_t> seg = {3, 4, 6, 13, 14, 100, 229};  // after 3 rows left alone
  const int64_t n_seg = static_cast<int64_t>(seg.size()) - 1, dim = 70;
  const std::vector<float> x = test::random_floats(rng, seg.back() * dim, 4.0f);
  for (CpuKernelLevel level : levels()) {
    for (int threads : {1, 3}) {
      auto be = make_cpu_backend(threads, level);
      std::vector<float> scratch = x, want(static_cast<size_t>(n_seg * dim));
      be->Backend::segment_means(scratch.data(), dim, seg.data(), n_seg, want.data());
      scratch = x;
      std::vector<float> got(want.size(), NAN);
      be->segment_means(scratch.data(), dim, seg.data(), n_seg, got.data());
      EXPECT_TRUE(test::bitwise_equal(got, want)) << threads << " threads";
      EXPECT_TRUE(std::equal(x.begin(), x.begin() + 3 * dim, scratch.begin()))
          << "rows before the first segment are left alone";
      for (int64_t s = 0; s < n_seg; ++s) {
        const int64_t n = seg[s + 1] - seg[s];
        for (int64_t i = 0; i < dim; ++i) {
          double sum = 0.0, abs_sum = 0.0;
          for (int64_t r = seg[s]; r < seg[s + 1]; ++r) {
            sum += x[r * dim + i];
            abs_sum += std::fabs(x[r * dim + i]);
          }
          // log2(n) + 1 roundings of partial sums at most abs_sum each.
          const double bound = (std::log2(static_cast<double>(n)) + 2.0) * 6e-8 * abs_sum / n;
          EXPECT_NEAR(got[s * dim + i], sum / n, bound) << "segment " << s << " column " << i;
        }
      }
    }
  }
  auto be = make_cpu_backend(1);
  std::vector<float> scratch = x, out(static_cast<size_t>(n_seg * dim));
  const std::vector<int32_t> empty = {0, 2, 2, 5}, descending = {4, 2};
  EXPECT_THROW(be->segment_means(scratch.data(), dim, empty.data(), 3, out.data()), Error);
  EXPECT_THROW(be->segment_means(scratch.data(), dim, descending.data(), 1, out.data()), Error);
}

TEST(GatherScatter, RoundTrip) {
  std::mt19937 rng(34);
  auto be = make_cpu_backend(2);
  const int64_t row = 13, n_src = 10;
  const std::vector<float> src = test::random_floats(rng, n_src * row);
  const std::vector<int32_t> idx = {7, 0, 9, 3};
  std::vector<float> gathered(idx.size() * row);
  be->gather_rows(src.data(), row, idx.data(), 4, gathered.data());
  for (size_t r = 0; r < idx.size(); ++r) {
    for (int64_t i = 0; i < row; ++i) EXPECT_EQ(gathered[r * row + i], src[idx[r] * row + i]);
  }
  std::vector<float> dst(n_src * row, -1.0f);
  be->scatter_rows(gathered.data(), row, idx.data(), 4, dst.data());
  for (int64_t r = 0; r < n_src; ++r) {
    const bool written = r == 7 || r == 0 || r == 9 || r == 3;
    for (int64_t i = 0; i < row; ++i) {
      EXPECT_EQ(dst[r * row + i], written ? src[r * row + i] : -1.0f);
    }
  }
}

TEST(GetRows, EveryTypeMatchesDequantizeRow) {
  std::mt19937 rng(35);
  for (DType t : test::kAllTypes) {
    const int64_t n_in = 512, n_out = 11;
    const std::vector<uint8_t> wd = test::random_weight(rng, t, n_out, n_in);
    const WeightView w{wd.data(), t, n_in, n_out};
    const std::vector<float> all = test::dequantize_all(w);
    const std::vector<int32_t> ids = {10, 0, 3, 3, 7};
    for (int threads : {1, 3}) {
      std::vector<float> out(ids.size() * n_in);
      make_cpu_backend(threads)->get_rows(w, ids.data(), 5, out.data());
      for (size_t r = 0; r < ids.size(); ++r) {
        for (int64_t i = 0; i < n_in; ++i) {
          ASSERT_EQ(out[r * n_in + i], all[ids[r] * n_in + i]) << dtype_name(t);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cb
