// rope: rotation by 0 is the identity, rotations compose (R(p)R(q) =
// R(p+q)), results match a float64 evaluation even at position 8191, and
// dimensions beyond rot_dim are untouched; the backend's table of angles
// rotates bitwise as the reference computing them in place does, across
// growth, bases, positions past its cap and threads.
//
// Tolerances are absolute on values ~N(0,1): 1e-6 against float64 (cos/sin
// rounded once from double, 2 f32 roundings per output); 2e-6 for
// composition (two rotations' worth of rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/rope_table.h"

namespace cb {
namespace {

constexpr int64_t kHeads = 3, kHeadDim = 64;

std::vector<float> rotate(Backend& be, std::vector<float> x, std::vector<int32_t> pos,
                          int64_t rot_dim = kHeadDim, float base = 100000.0f) {
  be.rope(x.data(), pos.data(), static_cast<int64_t>(pos.size()), kHeads, kHeadDim, rot_dim, base,
          nullptr);
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

// A negative position undoes the rotation of its opposite (how the blend
// compares a rotated key with one before RoPE).
TEST(Rope, NegativePositionUndoesTheRotation) {
  std::mt19937 rng(24);
  auto be = make_cpu_backend(2);
  const std::vector<float> x = test::random_floats(rng, 4 * kHeads * kHeadDim);
  const std::vector<int32_t> p = {1, 17, 3000, 8000}, minus_p = {-1, -17, -3000, -8000};
  const std::vector<float> back = rotate(*be, rotate(*be, x, p), minus_p);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 2e-6) << i;
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

// Llama 3.1+'s rope_freqs: pair i's frequency divided by factors[i].  The
// table (keyed by the factors' values: a second set gets its own) and the
// in-place path past its cap agree bitwise with the reference, which
// matches float64.
TEST(Rope, FrequencyFactorsDivideEachPairsFrequency) {
  std::mt19937 rng(28);
  auto be = make_cpu_backend(2);
  std::vector<float> factors(kHeadDim / 2), other(kHeadDim / 2, 1.0f);
  for (int64_t i = 0; i < kHeadDim / 2; ++i) factors[i] = 1.0f + 7.0f * i / (kHeadDim / 2);
  const int32_t past_cap =
      static_cast<int32_t>(RopeTable::kMaxBytes / (2 * (kHeadDim / 2) * sizeof(float))) + 3;
  const std::vector<int32_t> pos = {0, 5, 4095, past_cap};
  const std::vector<float> x = test::random_floats(rng, 4 * kHeads * kHeadDim);
  const float base = 500000.0f;
  for (const std::vector<float>* f : {&factors, &other, &factors}) {
    std::vector<float> y = x, want = x;
    be->rope(y.data(), pos.data(), 4, kHeads, kHeadDim, kHeadDim, base, f->data());
    ref::rope(want.data(), pos.data(), 4, kHeads, kHeadDim, kHeadDim, base, f->data());
    EXPECT_TRUE(test::bitwise_equal(y, want));
    for (size_t r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < kHeadDim / 2; ++i) {
        const double theta =
            pos[r] * std::pow(static_cast<double>(base), -2.0 * i / kHeadDim) / (*f)[i];
        const double a = x[r * kHeads * kHeadDim + 2 * i], b = x[r * kHeads * kHeadDim + 2 * i + 1];
        EXPECT_NEAR(y[r * kHeads * kHeadDim + 2 * i], a * std::cos(theta) - b * std::sin(theta),
                    1e-6);
      }
    }
  }
  // All-ones factors rotate as no factors.
  std::vector<float> ones = x, none = x;
  be->rope(ones.data(), pos.data(), 4, kHeads, kHeadDim, kHeadDim, base, other.data());
  be->rope(none.data(), pos.data(), 4, kHeads, kHeadDim, kHeadDim, base, nullptr);
  EXPECT_TRUE(test::bitwise_equal(ones, none));
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
  EXPECT_THROW(be->rope(z.data(), pos.data(), 2, kHeads, kHeadDim, 33, 10000.0f, nullptr), Error);
}

std::vector<float> reference(std::vector<float> x, const std::vector<int32_t>& pos, int64_t rot_dim,
                             float base) {
  ref::rope(x.data(), pos.data(), static_cast<int64_t>(pos.size()), kHeads, kHeadDim, rot_dim,
            base);
  return x;
}

TEST(Rope, TableRotatesBitwiseAsTheReference) {
  std::mt19937 rng(25);
  auto be = make_cpu_backend(2);
  // Growing positions (the table grows), then small ones again (it is
  // reused), two bases and a partial rotation (separate tables), negative
  // positions (the table's opposite angles) and ones past the table's cap
  // (computed in place).
  const int32_t past_cap =
      static_cast<int32_t>(RopeTable::kMaxBytes / (2 * (kHeadDim / 2) * sizeof(float))) + 7;
  const std::vector<std::vector<int32_t>> runs = {{0, 1, 2, 3}, {17, 900, 4095},
                                                  {8191, 5, 0}, {-3, 12, past_cap, 40000},
                                                  {1, 2},       {-1, -900, -8191, -past_cap}};
  for (float base : {10000.0f, 500000.0f}) {
    for (int64_t rot_dim : {kHeadDim, int64_t{32}}) {
      for (const auto& pos : runs) {
        const std::vector<float> x =
            test::random_floats(rng, static_cast<int64_t>(pos.size()) * kHeads * kHeadDim);
        EXPECT_TRUE(test::bitwise_equal(rotate(*be, x, pos, rot_dim, base),
                                        reference(x, pos, rot_dim, base)))
            << "base " << base << " rot_dim " << rot_dim << " first pos " << pos[0];
      }
    }
  }
}

TEST(Rope, TableIsSharedSafelyByConcurrentCallers) {
  // The fusor's loader thread rotates loaded KV while the compute thread
  // rotates Q and K: both grow and read the same table.
  auto be = make_cpu_backend(2);
  auto work = [&](uint32_t seed, bool* same) {
    std::mt19937 rng(seed);
    *same = true;
    for (int32_t top = 64; top <= 16384; top *= 2) {
      std::vector<int32_t> pos(64);
      for (auto& p : pos) p = static_cast<int32_t>(rng() % static_cast<uint32_t>(top));
      const std::vector<float> x =
          test::random_floats(rng, static_cast<int64_t>(pos.size()) * kHeads * kHeadDim);
      *same = *same && test::bitwise_equal(rotate(*be, x, pos, kHeadDim, 10000.0f),
                                           reference(x, pos, kHeadDim, 10000.0f));
    }
  };
  bool a = false, b = false;
  std::thread t(work, 26u, &a);
  work(27u, &b);
  t.join();
  EXPECT_TRUE(a);
  EXPECT_TRUE(b);
}

}  // namespace
}  // namespace cb
