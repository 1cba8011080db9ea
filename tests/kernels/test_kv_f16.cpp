// The F16 KV cache at the kernel level.  Reading: attention and
// attention_contributions over f16 K/V must give, bit for bit, what the same
// kernel gives over f32 K/V holding the f16-rounded values (the f16 element
// is widened exactly where it is loaded), at every kernel level, tiling and
// thread count.  Writing: scatter_rows_f16 must round every element as
// platform/half.h does (to nearest, ties to even, subnormals kept, overflow
// to infinity), gather_rows_f16 must widen exactly, at every level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"
#include "platform/half.h"

namespace cb {
namespace {

struct Case {
  int64_t n_head, n_head_kv, head_dim, n_kv;
  std::vector<int32_t> q_pos;
  int64_t window = 0;
};

std::vector<Case> cases() {
  Case prefill{8, 2, 72, 105, {}};  // 45 rows: several query blocks, an 8-wide dim tail
  for (int32_t p = 60; p < 105; ++p) prefill.q_pos.push_back(p);
  return {
      {9, 3, 64, 70, {69, 0, 33, 5, 31, 32, 64, 100, 12}},  // SmolLM2 geometry
      {4, 4, 20, 40, {39, 1, 17, 0}},                       // a head size with a tail of 4
      {3, 1, 13, 77, {76, 40, 3, 64, 65, 10, 0, 31, 32}},   // a scalar dim tail
      {2, 1, 128, 1000, {999, 517, 7}, 513},                // sliding window
      prefill,
  };
}

// Q, and K/V both as f16 bits and as the f32 values those bits hold.
struct Data {
  std::vector<float> q, k32, v32;
  std::vector<uint16_t> k16, v16;
};

std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
  return h;
}

std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = f16_to_f32(h[i]);
  return x;
}

Data make_data(std::mt19937& rng, const Case& c) {
  Data d;
  d.q =
      test::random_floats(rng, static_cast<int64_t>(c.q_pos.size()) * c.n_head * c.head_dim, 1.5f);
  d.k16 = to_f16(test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim, 1.5f));
  d.v16 = to_f16(test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim));
  d.k32 = widen(d.k16);
  d.v32 = widen(d.v16);
  return d;
}

AttentionArgs args(const Case& c, const Data& d, bool f16, float* out) {
  AttentionArgs a;
  a.q = d.q.data();
  a.q_pos = c.q_pos.data();
  a.n_q = static_cast<int64_t>(c.q_pos.size());
  a.k = f16 ? static_cast<const void*>(d.k16.data()) : d.k32.data();
  a.v = f16 ? static_cast<const void*>(d.v16.data()) : d.v32.data();
  a.kv_type = f16 ? DType::F16 : DType::F32;
  a.n_kv = c.n_kv;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.window = c.window;
  a.out = out;
  return a;
}

TEST(KvF16, AttentionEqualsF32OfRoundedValuesAtEveryLevel) {
  std::mt19937 rng(41);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    for (CpuKernelLevel level : test::all_levels()) {
      for (int threads : {1, 3}) {
        auto be = make_cpu_backend(threads, level);
        std::vector<float> want(d.q.size(), NAN), got(d.q.size(), NAN);
        be->attention(args(c, d, false, want.data()));
        be->attention(args(c, d, true, got.data()));
        EXPECT_TRUE(test::bitwise_equal(got, want))
            << "level " << static_cast<int>(level) << ", " << threads << " threads, head_dim "
            << c.head_dim;
      }
    }
  }
}

TEST(KvF16, SimdTilesEqualF32OfRoundedValues) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(42);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size()), group = c.n_head / c.n_head_kv;
    for (int64_t q_block : {int64_t{1}, int64_t{7}, n_q}) {
      std::vector<float> want(d.q.size(), NAN), got(d.q.size(), NAN);
      const AttentionArgs a32 = args(c, d, false, want.data());
      const AttentionArgs a16 = args(c, d, true, got.data());
      for (int64_t q0 = 0; q0 < n_q; q0 += q_block) {
        for (int64_t h0 = 0; h0 < c.n_head; h0 += group) {
          simd->attention_tile(a32, q0, std::min(n_q, q0 + q_block), h0, h0 + group);
          simd->attention_tile(a16, q0, std::min(n_q, q0 + q_block), h0, h0 + group);
        }
      }
      EXPECT_TRUE(test::bitwise_equal(got, want)) << simd->name << " q_block " << q_block;
    }
  }
}

TEST(KvF16, ReferenceEqualsF32OfRoundedValues) {
  std::mt19937 rng(43);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    std::vector<float> want(d.q.size(), NAN), got(d.q.size(), NAN);
    ref::attention(args(c, d, false, want.data()));
    ref::attention(args(c, d, true, got.data()));
    EXPECT_TRUE(test::bitwise_equal(got, want)) << "head_dim " << c.head_dim;
  }
}

TEST(KvF16, ContributionsEqualF32OfRoundedValuesAtEveryLevel) {
  std::mt19937 rng(44);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    for (CpuKernelLevel level : test::all_levels()) {
      auto be = make_cpu_backend(2, level);
      std::vector<float> want(static_cast<size_t>(c.n_kv), 0.5f), got(want);
      be->attention_contributions(args(c, d, false, nullptr), want.data());
      be->attention_contributions(args(c, d, true, nullptr), got.data());
      EXPECT_TRUE(test::bitwise_equal(got, want)) << "level " << static_cast<int>(level);
    }
  }
}

TEST(KvF16, RejectsAnUnknownKvType) {
  auto be = make_cpu_backend(1, CpuKernelLevel::kScalar);
  std::vector<float> x(64, 0.0f), out(64);
  const int32_t pos = 0;
  AttentionArgs a;
  a.q = x.data();
  a.q_pos = &pos;
  a.n_q = 1;
  a.k = a.v = x.data();
  a.kv_type = DType::Q8_0;
  a.n_kv = 1;
  a.n_head = a.n_head_kv = 1;
  a.head_dim = 64;
  a.out = out.data();
  EXPECT_THROW(be->attention(a), Error);
  EXPECT_THROW(be->attention_contributions(a, out.data()), Error);
}

// Values that exercise the rounding: ties between two f16 values (even and
// odd mantissas), subnormals, the largest finite f16 and the overflow
// threshold, signed zeros, and ordinary random ones.
std::vector<float> rounding_values(std::mt19937& rng, int64_t n) {
  std::vector<float> x = test::random_floats(rng, n, 4.0f);
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f + 1.0f / 2048.0f,  // tie: rounds down to even
                           1.0f + 3.0f / 2048.0f,  // tie: rounds up to even
                           -(1.0f + 3.0f / 2048.0f),
                           5.96e-8f,  // the smallest subnormal
                           3.0e-8f,   // rounds to 0 or the smallest subnormal
                           6.1e-5f,   // near the smallest normal
                           -1.0e-6f,
                           65504.0f,  // the largest finite f16
                           65519.0f,  // still rounds to 65504
                           65520.0f,  // rounds to infinity
                           -70000.0f,
                           1e-3f,
                           3.14159f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < x.size(); ++i)
    x[i * 3 % x.size()] = special[i];
  return x;
}

TEST(KvF16, ScatterRoundsAsPlatformAndGatherWidensAtEveryLevel) {
  std::mt19937 rng(45);
  for (int64_t row_len : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{67}}) {
    const int64_t n = 9, cache_rows = 20;
    const std::vector<float> src = rounding_values(rng, n * row_len);
    const std::vector<int32_t> idx = {3, 0, 19, 7, 8, 12, 1, 15, 4};
    std::vector<uint16_t> want(static_cast<size_t>(cache_rows * row_len), 0x7e00);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < row_len; ++j)
        want[idx[r] * row_len + j] = f32_to_f16(src[r * row_len + j]);
    for (CpuKernelLevel level : test::all_levels()) {
      for (int threads : {1, 3}) {
        auto be = make_cpu_backend(threads, level);
        std::vector<uint16_t> cache(want.size(), 0x7e00);  // untouched rows stay NaN
        be->scatter_rows_f16(src.data(), row_len, idx.data(), n, cache.data());
        EXPECT_EQ(cache, want) << "level " << static_cast<int>(level) << ", row " << row_len;
        std::vector<float> back(src.size(), NAN);
        be->gather_rows_f16(cache.data(), row_len, idx.data(), n, back.data());
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < row_len; ++j) {
            const float w = f16_to_f32(want[idx[r] * row_len + j]);
            ASSERT_EQ(std::memcmp(&back[r * row_len + j], &w, sizeof(float)), 0)
                << "level " << static_cast<int>(level) << " row " << r << " col " << j;
          }
      }
    }
  }
}

}  // namespace
}  // namespace cb
