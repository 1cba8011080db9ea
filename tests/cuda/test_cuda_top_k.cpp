// CUDA top_k against top_k_indices on the host: distinct values, ties,
// infinities and subnormals, every k, inside a batch, bad arguments.
// Without a CUDA device every test skips with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/cuda/cuda_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

using test::Cuda;

// Value sets that stress the selection: distinct values, heavy ties
// (including -0 against +0, which compare equal), all equal, sorted either
// way, infinities and subnormals.
std::vector<float> top_k_values(std::mt19937& rng, int64_t n, int kind) {
  std::vector<float> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> pick(0, 5);
  const float few[] = {-1.0f, 0.0f, -0.0f, 0.5f, 2.0f, 0.5f};
  for (int64_t i = 0; i < n; ++i) {
    float& x = v[static_cast<size_t>(i)];
    switch (kind) {
      case 0:
        x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
        break;
      case 1:
        x = few[pick(rng)];
        break;
      case 2:
        x = 3.0f;
        break;
      case 3:
        x = static_cast<float>(i % 1000);  // ascending runs with repeats
        break;
      case 4:
        x = static_cast<float>(n - i);
        break;
      default: {
        const float special[] = {std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::denorm_min(),
                                 -std::numeric_limits<float>::denorm_min(),
                                 1e30f,
                                 -1e30f};
        x = special[pick(rng)];
        break;
      }
    }
  }
  return v;
}

std::vector<int64_t> k_cases(int64_t n) {
  std::vector<int64_t> ks = {0, 1, n / 7, n / 2, n - 1, n};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [&](int64_t k) { return k < 0 || k > n; }),
           ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// Exactly top_k_indices: the same set (ties to the lower index) in the same
// (increasing) order, for values in backend and in host memory (65537
// floats are past the 64 KiB mirror limit: the staged path) and the output
// in host and in backend memory.
TEST_F(Cuda, TopKEqualsHostSelection) {
  std::mt19937 rng(20);
  for (int64_t n : {1, 2, 7, 33, 1000, 20000, 65537}) {
    for (int kind = 0; kind < 6; ++kind) {
      const std::vector<float> v = top_k_values(rng, n, kind);
      const float* dv = dev(v);
      for (int64_t k : k_cases(n)) {
        std::vector<int32_t> expect(static_cast<size_t>(k));
        top_k_indices(v.data(), n, k, expect.data());
        const std::string what =
            "n=" + std::to_string(n) + " kind=" + std::to_string(kind) + " k=" + std::to_string(k);
        std::vector<int32_t> got(static_cast<size_t>(k), -1);
        be_->top_k(dv, n, k, got.data());
        EXPECT_EQ(got, expect) << what << " (device values, host out)";
        std::fill(got.begin(), got.end(), -1);
        be_->top_k(v.data(), n, k, got.data());
        EXPECT_EQ(got, expect) << what << " (host values, host out)";
        int32_t* dout = dev(std::vector<int32_t>(static_cast<size_t>(std::max<int64_t>(k, 1)), -1));
        be_->top_k(dv, n, k, dout);
        EXPECT_EQ(host(dout, static_cast<size_t>(k)), expect) << what << " (device out)";
      }
    }
  }
}

// Inside a batch: a host output is complete when top_k returns; a backend
// output once the batch ends.  The values come from an op of the same batch.
TEST_F(Cuda, TopKInsideABatch) {
  std::mt19937 rng(21);
  const int64_t n = 5000, k = 750;
  const std::vector<float> a = test::random_floats(rng, n), b = test::random_floats(rng, n);
  std::vector<float> dev_sq(static_cast<size_t>(n));
  ref::row_sq_diff(a.data(), b.data(), n, 1, dev_sq.data());
  std::vector<int32_t> expect(static_cast<size_t>(k));
  top_k_indices(dev_sq.data(), n, k, expect.data());

  float* sq = dev(std::vector<float>(static_cast<size_t>(n)));
  int32_t* dout = dev(std::vector<int32_t>(static_cast<size_t>(k), -1));
  std::vector<int32_t> got(static_cast<size_t>(k), -1);
  be_->begin_batch();
  be_->row_sq_diff(dev(a), dev(b), n, 1, sq);
  be_->top_k(sq, n, k, got.data());
  EXPECT_EQ(got, expect) << "host output inside the batch";
  be_->top_k(sq, n, k, dout);
  be_->end_batch();
  EXPECT_EQ(host(dout, static_cast<size_t>(k)), expect) << "backend output after the batch";
}

TEST_F(Cuda, TopKRejectsBadArguments) {
  const std::vector<float> v(10, 1.0f);
  std::vector<int32_t> out(11);
  auto expect_invalid = [&](const float* values, int64_t n, int64_t k, int32_t* o) {
    try {
      be_->top_k(values, n, k, o);
      ADD_FAILURE() << "expected kInvalidArgument for n=" << n << " k=" << k;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  };
  expect_invalid(v.data(), 10, 11, out.data());
  expect_invalid(v.data(), 10, -1, out.data());
  expect_invalid(v.data(), -1, 0, out.data());
  expect_invalid(nullptr, 10, 2, out.data());
  expect_invalid(v.data(), 10, 2, nullptr);
  EXPECT_NO_THROW(be_->top_k(v.data(), 10, 0, nullptr));
  EXPECT_NO_THROW(be_->top_k(nullptr, 0, 0, nullptr));
}

}  // namespace
}  // namespace cb
