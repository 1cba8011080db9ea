// The CUDA backend against the scalar reference kernels (cb::ref), op by op:
// every weight type, both matmul paths (GEMV and dequantize + SGEMM), odd
// sizes and tails, host memory arguments (staged by the backend).  The
// plugin's loading and the missing device.  (Attention:
// test_cuda_attention.cpp; top_k: test_cuda_top_k.cpp; batches, uploads and
// threads: test_cuda_batch.cpp.)
//
// Without a CUDA device every test that needs one skips with a message; the
// one test that needs no device checks that asking for one is an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "platform/half.h"
#include "platform/shared_library.h"
#include "runtime/session.h"
#include "tests/cuda/cuda_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

// The matmul tolerance of the CPU kernel tests: |y - exact| <= 1e-5 *
// sum |W x|, loose enough for any f32 summation order, tight enough to
// catch a wrong scale or element (~1e-2 and up).
constexpr double kMatmulRelTol = 1e-5;
// matmul_q8's bf16 product (CB_CUDA_BF16): each operand rounded once to an
// 8-bit significand (at most 2^-8 relative) bounds an output's error by
// ~2^-7 (7.8e-3) of the sum of |w x|.
constexpr double kBf16MatmulRelTol = 1e-2;

// A backend whose matmul_q8 rounds to bf16 (the switch is read when the
// backend is made).
std::unique_ptr<Backend> make_bf16_backend(CudaBackendOptions o = {}) {
  setenv("CB_CUDA_BF16", "1", 1);
  auto be = make_cuda_backend(0, o);
  unsetenv("CB_CUDA_BF16");
  return be;
}

// A backend whose matmul_q8 GEMV takes int8 activations (CB_CUDA_INT8:
// "1", or a launch shape).
std::unique_ptr<Backend> make_int8_backend(const char* shape = "1") {
  setenv("CB_CUDA_INT8", shape, 1);
  CudaBackendOptions o;
  o.memory = CudaMemory::kManaged;
  auto be = make_cuda_backend(0, o);
  unsetenv("CB_CUDA_INT8");
  return be;
}

using test::Cuda;

std::vector<int64_t> n_in_cases(DType t) {
  switch (dtype_block_elems(t)) {
    case 1:
      return {1, 13, 40, 300, 1001};  // odd lengths: tails of the per-lane loops
    case 32:
      return {32, 96, 576, 1568};
    default:
      return {256, 768, 1792, 8960};  // 8960: rows split over warps
  }
}

std::vector<int32_t> random_ids(std::mt19937& rng, int64_t n, int64_t bound) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(bound - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& i : ids) i = d(rng);
  return ids;
}

// The build tree's plugin is found from build/bin (the test binary links
// the core statically) and its errors reach the core as cb::Error (the two
// tests after this one throw inside the plugin).
TEST(CudaPlugin, LoadsFromTheBuildTree) {
  if (std::getenv("CB_CUDA_PLUGIN") != nullptr) GTEST_SKIP() << "CB_CUDA_PLUGIN is set";
  std::string why;
  EXPECT_TRUE(cuda_plugin_available(&why)) << why;
}

// On a machine without the CUDA driver, choosing a backend (kAuto) does not
// load the plugin, which would map the CUDA runtime and cuBLAS for nothing.
TEST(CudaPlugin, AutoWithoutADriverLeavesThePluginUnloaded) {
  std::string error;
  if (open_shared_library("libcuda.so.1", &error) != nullptr)
    GTEST_SKIP() << "a CUDA driver is present";
  const auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    return std::string{std::istreambuf_iterator<char>(maps), {}};
  };
  if (mapped().find("libcacheblend-cuda") != std::string::npos)
    GTEST_SKIP() << "an earlier test of this process loaded the plugin";
  EXPECT_EQ(resolve_backend(BackendRequest::kAuto, 0), BackendKind::kCpu);
  EXPECT_EQ(mapped().find("libcacheblend-cuda"), std::string::npos);
  EXPECT_EQ(mapped().find("libcublas"), std::string::npos);
}

// Run by CTest with CB_CUDA_PLUGIN naming a file that does not exist
// (cuda.plugin_missing_is_a_clear_error): no fallback to another copy, and
// every entry point says why.
TEST(CudaPlugin, MissingPluginIsAClearError) {
  const char* path = std::getenv("CB_CUDA_PLUGIN");
  if (path == nullptr || std::filesystem::exists(path))
    GTEST_SKIP() << "needs CB_CUDA_PLUGIN naming a missing file";
  std::string why;
  EXPECT_FALSE(cuda_plugin_available(&why));
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("could not be loaded"), std::string::npos) << why;
  EXPECT_EQ(cuda_device_count(), 0);
  try {
    make_cuda_backend(0);
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("libcacheblend-cuda.so"), std::string::npos) << e.what();
  }
}

TEST(CudaNoDevice, MissingDeviceIsAnError) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  for (int device : {-1, n}) {
    try {
      make_cuda_backend(device);
      FAIL() << "expected kUnsupported for device " << device;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
}

// The hooks for tools (cuda_bench's timing, the kept weights' bytes) only
// accept a CUDA backend.
TEST(CudaNoDevice, ToolHooksNeedACudaBackend) {
  auto cpu = make_cpu_backend(1);
  try {
    cuda_mark(*cpu);
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  try {
    cuda_kept_f32_bytes(*cpu);
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

TEST_F(Cuda, AllocatesAlignedHostVisibleMemory) {
  EXPECT_STREQ(be_->name(), "cuda");
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{1} << 20}) {
    void* p = be_->alloc_buffer(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    if (bytes > 0) std::memset(p, 0xAB, bytes);
    be_->free_buffer(p);
  }
  be_->free_buffer(nullptr);
}

TEST_F(Cuda, OutOfMemoryIsAnError) {
  try {
    be_->alloc_buffer(std::numeric_limits<size_t>::max() / 2);
    FAIL() << "expected kOutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
  }
}

TEST_F(Cuda, PrepareWeightUploadsACopy) {
  std::mt19937 rng(1);
  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q4_K, 3, 256);
  const WeightView w{data.data(), DType::Q4_K, 256, 3};
  const WeightView p = be_->prepare_weight(w);
  EXPECT_NE(p.data, w.data);
  EXPECT_EQ(p.type, w.type);
  EXPECT_EQ(p.n_in, w.n_in);
  EXPECT_EQ(p.n_out, w.n_out);
}

// Decoding is bit-exact with dequantize_row (same f32 operations, no FMA
// contraction), so get_rows must match the reference exactly.
TEST_F(Cuda, GetRowsMatchesReferenceExactly) {
  std::mt19937 rng(2);
  for (DType t : test::kAllTypes) {
    for (int64_t n_in : n_in_cases(t)) {
      const int64_t n_out = 7, n = 11;
      const std::vector<uint8_t> data = test::random_weight(rng, t, n_out, n_in);
      const WeightView hw{data.data(), t, n_in, n_out};
      const WeightView w = be_->prepare_weight(hw);
      const std::vector<int32_t> ids = random_ids(rng, n, n_out);
      std::vector<float> expect(static_cast<size_t>(n * n_in));
      ref::get_rows(hw, ids.data(), n, expect.data());
      float* out = dev(std::vector<float>(expect.size(), -1.0f));
      be_->get_rows(w, dev(ids), n, out);
      EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect))
          << dtype_name(t) << " n_in=" << n_in;
    }
  }
}

void expect_matmul_close(const std::vector<float>& y, const std::vector<double>& exact,
                         const std::vector<double>& abs_sum, const std::string& what,
                         double rel_tol = kMatmulRelTol) {
  ASSERT_EQ(y.size(), exact.size());
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(static_cast<double>(y[i]) - exact[i]);
    if (!(err <= rel_tol * abs_sum[i] + 1e-30) && ++bad <= 3) {
      ADD_FAILURE() << what << " index " << i << ": " << y[i] << " vs " << exact[i] << " (scale "
                    << abs_sum[i] << ")";
    }
  }
}

// Both paths on every type: gemv_max_rows 8 sends up to 8 rows to the GEMV,
// 0 sends everything to dequantize + SGEMM; 17 rows is past the GEMV either
// way.  n_out values are odd so the last GEMV block is partial.
TEST_F(Cuda, MatmulMatchesFloat64OnEveryTypeAndPath) {
  std::mt19937 rng(3);
  for (int gemv_rows : {8, 0}) {
    auto be = make_cuda_backend(0, CudaBackendOptions{gemv_rows});
    auto bf16 = make_bf16_backend(CudaBackendOptions{gemv_rows});
    for (DType t : test::kAllTypes) {
      for (int64_t n_in : n_in_cases(t)) {
        for (int64_t n_rows : {1, 3, 8, 17}) {
          const int64_t n_out = 37;
          const std::vector<uint8_t> data = test::random_weight(rng, t, n_out, n_in);
          const WeightView hw{data.data(), t, n_in, n_out};
          const WeightView w = be->prepare_weight(hw);
          const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
          std::vector<double> exact, abs_sum;
          test::matmul_f64(test::dequantize_all(hw), n_out, n_in, x.data(), n_rows, &exact,
                           &abs_sum);
          float* y = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
          be->matmul(w, dev(x), n_rows, y);
          expect_matmul_close(host(y, exact.size()), exact, abs_sum,
                              std::string(dtype_name(t)) + " n_in=" + std::to_string(n_in) +
                                  " rows=" + std::to_string(n_rows) +
                                  " gemv_max_rows=" + std::to_string(gemv_rows));
          // The rounded entry point: exact by default, bf16 operands on
          // either path with CB_CUDA_BF16.
          const std::string what = "matmul_q8 " + std::string(dtype_name(t)) +
                                   " rows=" + std::to_string(n_rows) +
                                   " gemv_max_rows=" + std::to_string(gemv_rows);
          float* y8 = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
          be->matmul_q8(w, dev(x), n_rows, y8);
          expect_matmul_close(host(y8, exact.size()), exact, abs_sum, what);
          const WeightView wb = bf16->prepare_weight(hw);
          float* yb = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
          bf16->matmul_q8(wb, dev(x), n_rows, yb);
          expect_matmul_close(host(yb, exact.size()), exact, abs_sum, what + " bf16",
                              kBf16MatmulRelTol);
          // A projection's bias (host memory), added as the product is
          // written: bitwise the product and then add_bias, on both paths.
          const std::vector<float> bias = test::random_floats(rng, n_out);
          be->add_bias(y, bias.data(), n_rows, n_out);
          float* yf = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
          be->matmul_bias(w, dev(x), n_rows, bias.data(), yf, false);
          EXPECT_TRUE(test::bitwise_equal(host(yf, exact.size()), host(y, exact.size())))
              << "matmul_bias " << what;
          bf16->add_bias(yb, bias.data(), n_rows, n_out);
          bf16->matmul_bias(wb, dev(x), n_rows, bias.data(), yf, true);
          EXPECT_TRUE(test::bitwise_equal(host(yf, exact.size()), host(yb, exact.size())))
              << "matmul_bias " << what << " bf16";
        }
      }
    }
  }
}

// bf16 keeps f32's exponent range: rows far beyond f16's range (65504) and
// far below its normal range come out as right as ordinary ones.  And a
// row's product is the same (to f32 summation order) whether its batch took
// the GEMV (few rows) or the tensor-core GEMM: prefix reuse depends on it.
TEST_F(Cuda, MatmulQ8Bf16KeepsRowsOfAnyMagnitudeOnEitherPath) {
  std::mt19937 rng(11);
  const auto be = make_bf16_backend();
  const int64_t n_in = 512, n_out = 65, n_rows = 12;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F32}) {
    const std::vector<uint8_t> data = test::random_weight(rng, t, n_out, n_in);
    const WeightView hw{data.data(), t, n_in, n_out};
    const WeightView w = be->prepare_weight(hw);
    std::vector<float> x = test::random_floats(rng, n_rows * n_in);
    for (int64_t i = 0; i < n_in; ++i) {
      x[static_cast<size_t>(1 * n_in + i)] *= 1e6f;   // past f16's largest
      x[static_cast<size_t>(2 * n_in + i)] *= 1e-7f;  // f16 subnormals unscaled
      x[static_cast<size_t>(3 * n_in + i)] = 0.0f;    // all zero
    }
    x[static_cast<size_t>(4 * n_in + 7)] = 3e5f;  // one outlier in an ordinary row
    std::vector<double> exact, abs_sum;
    test::matmul_f64(test::dequantize_all(hw), n_out, n_in, x.data(), n_rows, &exact, &abs_sum);
    float* y = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
    be->matmul_q8(w, dev(x), n_rows, y);
    const std::vector<float> many = host(y, exact.size());
    expect_matmul_close(many, exact, abs_sum, std::string("matmul_q8 gemm ") + dtype_name(t),
                        kBf16MatmulRelTol);
    for (int64_t r0 = 0; r0 < n_rows; r0 += 3) {  // the same rows, 3 at a time: the GEMV
      float* y3 = dev(std::vector<float>(static_cast<size_t>(3 * n_out), NAN));
      be->matmul_q8(w, dev(std::vector<float>(x.begin() + r0 * n_in, x.begin() + (r0 + 3) * n_in)),
                    3, y3);
      const std::vector<float> few = host(y3, static_cast<size_t>(3 * n_out));
      for (size_t i = 0; i < few.size(); ++i) {
        const size_t at = static_cast<size_t>(r0 * n_out) + i;
        EXPECT_LE(std::fabs(few[i] - many[at]), 1e-5 * abs_sum[at] + 1e-30)
            << dtype_name(t) << " row " << r0 + static_cast<int64_t>(i) / n_out;
      }
    }
  }
}

// CB_CUDA_INT8: matmul_q8's GEMV on Q4_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1 and
// Q8_0 weights is the CPU's matmul_q8 (ref::quantize_q8a, then
// ref::gemv_q8), each row's block terms the same and only their order of
// addition different, on every launch shape (one row a warp over two
// warps, two rows a warp with a partial last block, many steps a warp, a
// step with idle lanes), with and without a bias, and replayed from a
// graph.  Other types, and rows too long for the kernel's shared memory,
// keep the f32 GEMV.
TEST_F(Cuda, Int8GemvMatchesCpuMatmulQ8) {
  std::mt19937 rng(12);
  const auto be = make_int8_backend();
  struct Shape {
    int64_t n_out, n_in;
  };
  const std::vector<Shape> k_shapes = {{37, 256}, {37, 1536}, {4099, 1536}, {300, 8960}, {5, 1280}};
  // The 32-element types: rows of 576 (SmolLM2) and 896 (Qwen2.5-0.5B),
  // not whole super-blocks.
  const std::vector<Shape> block_shapes = {{37, 576}, {37, 896}, {4099, 576}, {300, 4864}, {5, 32}};
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                  DType::Q8_0}) {
    const bool k_quant = t == DType::Q4_K || t == DType::Q6_K;
    for (const Shape sh : k_quant ? k_shapes : block_shapes) {
      const std::vector<uint8_t> data = test::random_weight(rng, t, sh.n_out, sh.n_in);
      const WeightView hw{data.data(), t, sh.n_in, sh.n_out};
      const WeightView w = be->prepare_weight(hw);
      for (int64_t n_rows : {1, 3}) {
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(sh.n_out) + "x" +
                                 std::to_string(sh.n_in) + " rows=" + std::to_string(n_rows);
        const std::vector<float> x = test::random_floats(rng, n_rows * sh.n_in);
        std::vector<double> exact, abs_sum;
        test::matmul_f64(test::dequantize_all(hw), sh.n_out, sh.n_in, x.data(), n_rows, &exact,
                         &abs_sum);
        std::vector<float> expect(exact.size());
        std::vector<int8_t> qs(static_cast<size_t>(sh.n_in));
        std::vector<float> d(static_cast<size_t>(sh.n_in / 32)), sums(d.size());
        for (int64_t r = 0; r < n_rows; ++r) {
          ref::quantize_q8a(x.data() + r * sh.n_in, sh.n_in, qs.data(), d.data(), sums.data());
          ref::gemv_q8(hw, Q8Row{qs.data(), d.data(), sums.data()}, expect.data() + r * sh.n_out, 0,
                       sh.n_out);
        }
        float* y = dev(std::vector<float>(expect.size(), NAN));
        be->matmul_q8(w, dev(x), n_rows, y);
        const std::vector<float> got = host(y, expect.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_LE(std::fabs(got[i] - expect[i]), kMatmulRelTol * abs_sum[i] + 1e-30)
              << what << " output " << i << ": " << got[i] << " against " << expect[i];
        }
        const std::vector<float> bias = test::random_floats(rng, sh.n_out);
        float* yb = dev(std::vector<float>(expect.size(), NAN));
        be->matmul_bias(w, dev(x), n_rows, bias.data(), yb, true);
        be->add_bias(y, bias.data(), n_rows, sh.n_out);
        EXPECT_TRUE(test::bitwise_equal(host(yb, got.size()), host(y, got.size())))
            << "matmul_bias " << what;
      }
      // Probed, captured, then replayed (the same pointers each time, as
      // replays require): the same bits each time.
      const float* dx = dev(test::random_floats(rng, sh.n_in));
      float* y = dev(std::vector<float>(static_cast<size_t>(sh.n_out)));
      std::vector<float> first;
      for (int run = 0; run < 3; ++run) {
        std::fill(y, y + sh.n_out, NAN);
        if (be->begin_replay(1) != Backend::ReplayStart::kReplayed) be->matmul_q8(w, dx, 1, y);
        be->end_batch();
        const std::vector<float> got = host(y, static_cast<size_t>(sh.n_out));
        if (run == 0) first = got;
        EXPECT_TRUE(test::bitwise_equal(got, first)) << "run " << run << " of " << dtype_name(t);
      }
      be->forget_replay(1);
    }
  }
  // The f32 GEMV where the int8 one does not apply: bit for bit matmul().
  for (const auto& [t, n_in] :
       {std::pair{DType::IQ4_NL, int64_t{1536}}, std::pair{DType::Q4_K, int64_t{40192}}}) {
    const std::vector<uint8_t> data = test::random_weight(rng, t, 9, n_in);
    const WeightView w = be->prepare_weight({data.data(), t, n_in, 9});
    const float* dx = dev(test::random_floats(rng, n_in));
    float* y = dev(std::vector<float>(9, NAN));
    float* y8 = dev(std::vector<float>(9, NAN));
    be->matmul(w, dx, 1, y);
    be->matmul_q8(w, dx, 1, y8);
    EXPECT_TRUE(test::bitwise_equal(host(y8, 9), host(y, 9))) << dtype_name(t) << " n_in=" << n_in;
  }
}

// Every launch shape CB_CUDA_INT8 can force (weight rows a warp x warps a
// row) gives the CPU's product; shapes that differ only in rows a warp add
// each row's terms in the same order, so their bits are equal.  A value it
// does not know is a clear error.
TEST_F(Cuda, Int8GemvLaunchShapes) {
  std::mt19937 rng(13);
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_0}) {
    const bool k_quant = t != DType::Q5_0;
    for (const auto& [n_out, n_in] :
         {std::pair<int64_t, int64_t>{4099, k_quant ? 1536 : 896}, {300, k_quant ? 8960 : 4864}}) {
      const std::vector<uint8_t> data = test::random_weight(rng, t, n_out, n_in);
      const WeightView hw{data.data(), t, n_in, n_out};
      const std::vector<float> x = test::random_floats(rng, n_in);
      std::vector<double> exact, abs_sum;
      test::matmul_f64(test::dequantize_all(hw), n_out, n_in, x.data(), 1, &exact, &abs_sum);
      std::vector<int8_t> qs(static_cast<size_t>(n_in));
      std::vector<float> d(static_cast<size_t>(n_in / 32)), sums(d.size());
      std::vector<float> expect(static_cast<size_t>(n_out));
      ref::quantize_q8a(x.data(), n_in, qs.data(), d.data(), sums.data());
      ref::gemv_q8(hw, Q8Row{qs.data(), d.data(), sums.data()}, expect.data(), 0, n_out);
      const float* dx = dev(x);
      std::vector<float> one_row_a_warp;
      for (const char* shape : {"1x1", "2x1", "4x1", "1x2", "2x2", "1x4"}) {
        const auto be = make_int8_backend(shape);
        const WeightView w = be->prepare_weight(hw);
        float* y = dev(std::vector<float>(static_cast<size_t>(n_out), NAN));
        be->matmul_q8(w, dx, 1, y);
        const std::vector<float> got = host(y, static_cast<size_t>(n_out));
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_LE(std::fabs(got[i] - expect[i]), kMatmulRelTol * abs_sum[i] + 1e-30)
              << dtype_name(t) << " " << n_out << "x" << n_in << " shape " << shape << " output "
              << i;
        }
        if (shape[2] == '1') {
          if (one_row_a_warp.empty()) one_row_a_warp = got;
          EXPECT_TRUE(test::bitwise_equal(got, one_row_a_warp))
              << dtype_name(t) << " " << n_out << "x" << n_in << " shape " << shape;
        }
      }
    }
  }
  for (const char* bad : {"yes", "3x1", "2x", "1x8", "x"}) {
    setenv("CB_CUDA_INT8", bad, 1);
    try {
      make_cuda_backend(0);
      ADD_FAILURE() << "CB_CUDA_INT8=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("CB_CUDA_INT8"), std::string::npos) << e.what();
    }
    unsetenv("CB_CUDA_INT8");
  }
}

// A weight bigger than the SGEMM path's 64 MiB scratch is converted in
// several slices; the last one is partial.
TEST_F(Cuda, MatmulSlicesLargeWeights) {
  std::mt19937 rng(4);
  const int64_t n_in = 4096, n_out = 4099, n_rows = 9;
  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q8_0, n_out, n_in);
  const WeightView hw{data.data(), DType::Q8_0, n_in, n_out};
  const WeightView w = be_->prepare_weight(hw);
  const std::vector<float> x = test::random_floats(rng, n_rows * n_in);
  std::vector<float> expect(static_cast<size_t>(n_rows * n_out));
  ref::matmul(hw, x.data(), n_rows, expect.data());
  float* y = dev(std::vector<float>(expect.size(), NAN));
  be_->matmul(w, dev(x), n_rows, y);
  const std::vector<float> got = host(y, expect.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expect[i], 1e-3 * (1.0 + std::fabs(expect[i]))) << i;
  }
}

TEST_F(Cuda, RmsnormMatchesReference) {
  std::mt19937 rng(5);
  for (int64_t dim : {1, 7, 64, 576, 1001}) {
    const int64_t n_rows = 5;
    const std::vector<float> x = test::random_floats(rng, n_rows * dim, 3.0f);
    const std::vector<float> wt = test::random_floats(rng, dim);
    std::vector<float> expect(x.size());
    ref::rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-5f, expect.data());
    float* out = dev(std::vector<float>(x.size()));
    be_->rmsnorm(dev(x), dev(wt), n_rows, dim, 1e-5f, out);
    const std::vector<float> got = host(out, x.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], expect[i], 1e-6 * (1.0 + std::fabs(expect[i]))) << "dim " << dim;
    }
  }
}

// Both a full rotation and a partial one (rot_dim < head_dim leaves the
// tail untouched), positions into the thousands.
TEST_F(Cuda, RopeMatchesReference) {
  std::mt19937 rng(6);
  struct Shape {
    int64_t n_heads, head_dim, rot_dim;
  };
  for (const Shape& s : {Shape{3, 64, 64}, Shape{2, 128, 64}, Shape{5, 10, 6}, Shape{1, 8, 0}}) {
    const int64_t n_rows = 9, row = s.n_heads * s.head_dim;
    std::vector<float> x = test::random_floats(rng, n_rows * row);
    const std::vector<int32_t> pos = {0, 1, 2, 17, 100, 511, 4095, 8000, 3};
    float* dx = dev(x);
    be_->rope(dx, dev(pos), n_rows, s.n_heads, s.head_dim, s.rot_dim, 10000.0f, nullptr);
    ref::rope(x.data(), pos.data(), n_rows, s.n_heads, s.head_dim, s.rot_dim, 10000.0f);
    const std::vector<float> got = host(dx, x.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], x[i], 2e-6) << "head_dim " << s.head_dim << " rot_dim " << s.rot_dim;
    }
  }
}

TEST_F(Cuda, ElementwiseOpsMatchReference) {
  std::mt19937 rng(8);
  for (int64_t n : {1, 31, 1000, 100003}) {
    const std::vector<float> g = test::random_floats(rng, n, 4.0f);
    const std::vector<float> u = test::random_floats(rng, n);
    std::vector<float> expect(static_cast<size_t>(n));
    ref::silu_mul(g.data(), u.data(), n, expect.data());
    float* out = dev(std::vector<float>(expect.size()));
    be_->silu_mul(dev(g), dev(u), n, out);
    std::vector<float> got = host(out, expect.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], expect[i], 1e-6 * (1.0 + std::fabs(expect[i]))) << "silu_mul " << i;
    }

    ref::gelu_mul(g.data(), u.data(), n, expect.data());
    be_->gelu_mul(dev(g), dev(u), n, out);
    got = host(out, expect.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], expect[i], 1e-5 * (1.0 + std::fabs(expect[i]))) << "gelu_mul " << i;
    }

    std::vector<float> scaled = g;
    for (float& x : scaled) x *= 25.3f;
    float* dg = dev(g);
    be_->scale(dg, n, 25.3f);
    EXPECT_TRUE(test::bitwise_equal(host(dg, scaled.size()), scaled)) << "scale n=" << n;

    // add, with out aliasing its first operand (as the runtime's residual).
    ref::add(g.data(), u.data(), n, expect.data());
    float* a = dev(g);
    be_->add(a, dev(u), n, a);
    EXPECT_TRUE(test::bitwise_equal(host(a, expect.size()), expect)) << "add n=" << n;
  }
  // add_bias (qwen2's projection biases), the bias in host memory.
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 7}, {300, 96}}) {
    const std::vector<float> x = test::random_floats(rng, rows * dim);
    const std::vector<float> bias = test::random_floats(rng, dim);
    std::vector<float> expect = x;
    for (int64_t r = 0; r < rows; ++r)
      ref::add(&expect[r * dim], bias.data(), dim, &expect[r * dim]);
    float* dx = dev(x);
    be_->add_bias(dx, bias.data(), rows, dim);
    EXPECT_TRUE(test::bitwise_equal(host(dx, expect.size()), expect)) << "add_bias " << rows;
  }
}

TEST_F(Cuda, RowOpsMatchReference) {
  std::mt19937 rng(9);
  for (int64_t row_len : {1, 5, 64, 577}) {
    const int64_t n_src = 20, n = 7;
    const std::vector<float> src = test::random_floats(rng, n_src * row_len);
    const std::vector<int32_t> idx = {19, 0, 3, 3, 12, 7, 18};  // repeats are fine for gather
    std::vector<float> expect(static_cast<size_t>(n * row_len));
    ref::gather_rows(src.data(), row_len, idx.data(), n, expect.data());
    float* g = dev(std::vector<float>(expect.size()));
    be_->gather_rows(dev(src), row_len, dev(idx), n, g);
    EXPECT_TRUE(test::bitwise_equal(host(g, expect.size()), expect)) << "gather " << row_len;

    const std::vector<int32_t> sidx = {4, 19, 0, 11, 2, 8, 16};  // distinct for scatter
    std::vector<float> dst = test::random_floats(rng, n_src * row_len);
    float* ddst = dev(dst);
    const std::vector<float> rows(expect);
    ref::scatter_rows(rows.data(), row_len, sidx.data(), n, dst.data());
    be_->scatter_rows(dev(rows), row_len, dev(sidx), n, ddst);
    EXPECT_TRUE(test::bitwise_equal(host(ddst, dst.size()), dst)) << "scatter " << row_len;

    const std::vector<float> b = test::random_floats(rng, n_src * row_len);
    std::vector<float> sq(static_cast<size_t>(n_src));
    ref::row_sq_diff(src.data(), b.data(), n_src, row_len, sq.data());
    float* dsq = dev(std::vector<float>(sq.size()));
    be_->row_sq_diff(dev(src), dev(b), n_src, row_len, dsq);
    const std::vector<float> got = host(dsq, sq.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], sq[i], 1e-6 * (1.0 + sq[i])) << "row_sq_diff " << row_len;
    }
  }
}

// Kept f32 copies of quantized weights (CudaBackendOptions::f32_weight_bytes)
// change nothing but the time: the same bits as dequantizing at every call,
// on the first call (which makes the copy) and later ones, for a weight of
// several 64 MiB slices, and where the budget holds only some weights.
TEST_F(Cuda, KeptF32WeightsGiveTheSameBits) {
  // The variable overrides every budget below; it is put back at the end.
  const char* set = std::getenv("CB_CUDA_F32_WEIGHTS_MB");
  const std::optional<std::string> caller = set ? std::optional<std::string>(set) : std::nullopt;
  unsetenv("CB_CUDA_F32_WEIGHTS_MB");
  std::mt19937 rng(14);
  CudaBackendOptions none, all, some;
  none.gemv_max_rows = all.gemv_max_rows = some.gemv_max_rows = 0;
  none.f32_weight_bytes = 0;
  all.f32_weight_bytes = int64_t{1} << 30;
  some.f32_weight_bytes = int64_t{64} << 20;  // the smaller weights, not the largest
  auto plain = make_cuda_backend(0, none);
  auto kept = make_cuda_backend(0, all);
  auto partly = make_cuda_backend(0, some);
  struct Shape {
    DType t;
    int64_t n_in, n_out;
  };
  for (const Shape& sh : {Shape{DType::Q4_K, 4096, 5000}, Shape{DType::Q6_K, 1536, 333},
                          Shape{DType::Q8_0, 896, 4864}, Shape{DType::F16, 300, 77}}) {
    const std::vector<uint8_t> data = test::random_weight(rng, sh.t, sh.n_out, sh.n_in);
    const WeightView hw{data.data(), sh.t, sh.n_in, sh.n_out};
    for (int64_t n_rows : {9, 300}) {
      const std::vector<float> x = test::random_floats(rng, n_rows * sh.n_in);
      const size_t n_y = static_cast<size_t>(n_rows * sh.n_out);
      float* want = dev(std::vector<float>(n_y, NAN));
      plain->matmul(plain->prepare_weight(hw), dev(x), n_rows, want);
      const std::vector<float> expect = host(want, n_y);
      for (Backend* be : {kept.get(), partly.get()}) {
        const WeightView w = be->prepare_weight(hw);
        for (int call = 0; call < 2; ++call) {
          float* y = dev(std::vector<float>(n_y, NAN));
          be->matmul(w, dev(x), n_rows, y);
          EXPECT_TRUE(test::bitwise_equal(host(y, n_y), expect))
              << dtype_name(sh.t) << " " << sh.n_in << " x " << sh.n_out << ", rows " << n_rows
              << ", call " << call << (be == kept.get() ? ", all kept" : ", some kept");
        }
      }
    }
  }
  // The copies were made: every weight at least once where all fit, and
  // only some (not the largest) within the smaller budget.
  const int64_t all_f32 = (4096 * 5000 + 1536 * 333 + 896 * 4864 + 300 * 77) * 4;
  EXPECT_EQ(cuda_kept_f32_bytes(*plain), 0);
  EXPECT_GE(cuda_kept_f32_bytes(*kept), all_f32);
  EXPECT_GT(cuda_kept_f32_bytes(*partly), 0);
  EXPECT_LE(cuda_kept_f32_bytes(*partly), some.f32_weight_bytes);
  setenv("CB_CUDA_F32_WEIGHTS_MB", "many", 1);
  EXPECT_THROW(make_cuda_backend(0), Error);
  if (caller) {
    setenv("CB_CUDA_F32_WEIGHTS_MB", caller->c_str(), 1);
  } else {
    unsetenv("CB_CUDA_F32_WEIGHTS_MB");
  }
}

// segment_means in the contract's order: the CPU's bits, from device rows
// (the chunk shift's case, in a batch) and from host rows.
TEST_F(Cuda, SegmentMeansMatchCpuBitwise) {
  std::mt19937 rng(13);
  const std::vector<int32_t> seg = {2, 3, 5, 12, 140, 141, 400};
  const int64_t n_seg = static_cast<int64_t>(seg.size()) - 1;
  for (int64_t row_len : {1, 33, 256}) {
    const std::vector<float> x = test::random_floats(rng, seg.back() * row_len, 3.0f);
    std::vector<float> scratch = x, expect(static_cast<size_t>(n_seg * row_len));
    ref::segment_means(scratch.data(), row_len, seg.data(), n_seg, expect.data());
    float* dx = dev(x);
    float* dout = dev(std::vector<float>(expect.size(), NAN));
    be_->begin_batch();
    be_->segment_means(dx, row_len, seg.data(), n_seg, dout);
    be_->end_batch();
    EXPECT_TRUE(test::bitwise_equal(host(dout, expect.size()), expect)) << "device " << row_len;
    std::vector<float> hx = x, hout(expect.size(), NAN);
    be_->segment_means(hx.data(), row_len, seg.data(), n_seg, hout.data());
    EXPECT_TRUE(test::bitwise_equal(hout, expect)) << "host " << row_len;
  }
  const std::vector<int32_t> empty = {0, 1, 1};
  std::vector<float> x(4), out(4);
  EXPECT_THROW(be_->segment_means(x.data(), 1, empty.data(), 2, out.data()), Error);
}

// The runtime hands some arguments in ordinary host memory (norm vectors
// from the mmapped model, ids and positions in std::vector): the backend
// stages them, and copies host outputs back.
TEST_F(Cuda, AcceptsHostMemoryArguments) {
  std::mt19937 rng(10);
  const int64_t dim = 96, n_rows = 3;
  const std::vector<float> x = test::random_floats(rng, n_rows * dim);
  const std::vector<float> wt = test::random_floats(rng, dim);
  std::vector<float> expect(x.size()), got(x.size());
  ref::rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-6f, expect.data());
  be_->rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-6f, got.data());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-6) << i;

  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q6_K, 5, 256);
  const WeightView hw{data.data(), DType::Q6_K, 256, 5};
  const WeightView w = be_->prepare_weight(hw);
  const std::vector<int32_t> ids = {4, 0, 4, 2};
  std::vector<float> rows_ref(4 * 256), rows(4 * 256);
  ref::get_rows(hw, ids.data(), 4, rows_ref.data());
  be_->get_rows(w, ids.data(), 4, rows.data());
  EXPECT_TRUE(test::bitwise_equal(rows, rows_ref));

  // Gather from a host source: the backend finds its extent from idx.
  const std::vector<int32_t> idx = {2, 0};
  std::vector<float> gathered(2 * dim), gathered_ref(2 * dim);
  ref::gather_rows(x.data(), dim, idx.data(), 2, gathered_ref.data());
  be_->gather_rows(x.data(), dim, idx.data(), 2, gathered.data());
  EXPECT_TRUE(test::bitwise_equal(gathered, gathered_ref));

  // In place on a host buffer.
  std::vector<float> r = test::random_floats(rng, 2 * 64), r_ref = r;
  const std::vector<int32_t> pos = {5, 1000};
  ref::rope(r_ref.data(), pos.data(), 2, 1, 64, 64, 10000.0f);
  be_->rope(r.data(), pos.data(), 2, 1, 64, 64, 10000.0f, nullptr);
  for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(r[i], r_ref[i], 2e-6) << i;
}

// Small host inputs are mirrored on the device per host address: a mirror
// must never serve stale bytes when the host memory behind the same pointer
// changes between calls (positions and norm weights are reused pointers).
TEST_F(Cuda, HostInputsChangedBetweenCallsAreSeen) {
  std::mt19937 rng(11);
  const int64_t dim = 64, n_rows = 2;
  const std::vector<float> x = test::random_floats(rng, n_rows * dim);
  std::vector<float> wt = test::random_floats(rng, dim);
  std::vector<int32_t> pos = {3, 7};
  for (int round = 0; round < 3; ++round) {
    std::vector<float> expect(x.size()), got(x.size());
    ref::rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-6f, expect.data());
    be_->rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-6f, got.data());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-6) << round;
    std::vector<float> r = x, r_ref = x;
    ref::rope(r_ref.data(), pos.data(), n_rows, 1, dim, dim, 10000.0f);
    be_->rope(r.data(), pos.data(), n_rows, 1, dim, dim, 10000.0f, nullptr);
    for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(r[i], r_ref[i], 2e-6) << round;
    for (float& v : wt) v *= -1.5f;  // same addresses, new contents
    pos[0] += 100;
    pos[1] += 1;
  }
}

TEST_F(Cuda, RejectsBadArguments) {
  const WeightView w{nullptr, DType::Q4_0, 33, 1};
  EXPECT_THROW(be_->matmul(w, nullptr, 1, nullptr), Error);
  EXPECT_THROW(be_->rmsnorm(nullptr, nullptr, 1, 0, 1e-5f, nullptr), Error);
  EXPECT_THROW(be_->rope(nullptr, nullptr, 1, 1, 8, 9, 10000.0f, nullptr), Error);
}

// ---------------------------------------------------------------- top_k --

}  // namespace
}  // namespace cb
