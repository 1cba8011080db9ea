// rope: rotation by 0 is the identity, rotations compose (R(p)R(q) =
// R(p+q)), results match a float64 evaluation even at position 8191, and
// dimensions beyond rot_dim are untouched.
//
// Tolerances are absolute on values ~N(0,1): 1e-6 against float64 (cos/sin
// rounded once from double, 2 f32 roundings per output); 2e-6 for
// composition (two rotations' worth of rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"

namespace cb {
namespace {

constexpr int64_t kHeads = 3, kHeadDim = 64;

std::vector<float> rotate(Backend& be, std::vector<float> x, std::vector<int32_t> pos,
                          int64_t rot_dim = kHeadDim, float base = 100000.0f) {
  be.rope(x.data(), pos.data(), static_cast<int64_t>(pos.size()), kHeads, kHeadDim, rot_dim, base);
  return x;
}

TEST(Rope, ZeroIsIdentity) {
  std::mt19937 rng(21);
  auto be = make_cpu_backend(2);
  const std::vector<float> x = test::random_floats(rng, 4 * kHeads * kHeadDim);
  EXPECT_TRUE(test::bitwise_equal(rotate(*be, x, {0, 0, 0, 0}), x));
}

TEST(Rope, Composes) {
  std::mt19937 rng(22);
  auto be = make_cpu_backend(2);
  const std::vector<float> x = test::random_floats(rng, 4 * kHeads * kHeadDim);
  const std::vector<int32_t> p = {1, 17, 3000, 8000}, q = {2, 100, 5, 191};
  std::vector<int32_t> pq(p.size());
  for (size_t i = 0; i < p.size(); ++i) pq[i] = p[i] + q[i];
  const std::vector<float> two_steps = rotate(*be, rotate(*be, x, p), q);
  const std::vector<float> one_step = rotate(*be, x, pq);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(two_steps[i], one_step[i], 2e-6) << i;
}

TEST(Rope, MatchesFloat64AtLargePositions) {
  std::mt19937 rng(23);
  auto be = make_cpu_backend(3);
  for (float base : {10000.0f, 100000.0f}) {
    const std::vector<int32_t> pos = {0, 1, 17, 4095, 8191};
    const std::vector<float> x = test::random_floats(rng, 5 * kHeads * kHeadDim);
    const std::vector<float> y = rotate(*be, x, pos, kHeadDim, base);
    for (size_t r = 0; r < pos.size(); ++r) {
      for (int64_t h = 0; h < kHeads; ++h) {
        const size_t off = (r * kHeads + h) * kHeadDim;
        for (int64_t i = 0; i < kHeadDim / 2; ++i) {
          const double theta = pos[r] * std::pow(static_cast<double>(base), -2.0 * i / kHeadDim);
          const double a = x[off + 2 * i], b = x[off + 2 * i + 1];
          EXPECT_NEAR(y[off + 2 * i], a * std::cos(theta) - b * std::sin(theta), 1e-6);
          EXPECT_NEAR(y[off + 2 * i + 1], a * std::sin(theta) + b * std::cos(theta), 1e-6);
        }
      }
    }
  }
}

TEST(Rope, PartialRotationLeavesTailAlone) {
  std::mt19937 rng(24);
  auto be = make_cpu_backend(1);
  const std::vector<float> x = test::random_floats(rng, 2 * kHeads * kHeadDim);
  const std::vector<float> y = rotate(*be, x, {5, 900}, 32);
  for (size_t row = 0; row < 2 * kHeads; ++row) {
    for (int64_t i = 32; i < kHeadDim; ++i) {
      EXPECT_EQ(y[row * kHeadDim + i], x[row * kHeadDim + i]);
    }
    // The rotated part did change (position 5 and 900 are not multiples of 2 pi).
    EXPECT_NE(y[row * kHeadDim], x[row * kHeadDim]);
  }
  std::vector<float> z = x;
  const std::vector<int32_t> pos = {1, 1};
  EXPECT_THROW(be->rope(z.data(), pos.data(), 2, kHeads, kHeadDim, 33, 10000.0f), Error);
}

}  // namespace
}  // namespace cb
