// The CUDA backend against the scalar reference kernels (cb::ref), op by op:
// every weight type, both matmul paths (GEMV and dequantize + SGEMM), odd
// sizes and tails, attention on subsets of query rows with GQA, and host
// memory arguments (staged by the backend).  Then what the runtime's
// pipeline relies on: top_k against top_k_indices, batches (deferred
// completion) against unbatched runs, uploads from staging and pageable
// memory, a loader thread uploading and rotating KV rows while the main
// thread runs a batch, and zero-copy buffers.
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
#include <latch>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

// The matmul tolerance of the CPU kernel tests: |y - exact| <= 1e-5 *
// sum |W x|, loose enough for any f32 summation order, tight enough to
// catch a wrong scale or element (~1e-2 and up).
constexpr double kMatmulRelTol = 1e-5;

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none): the CUDA backend is "
                      "compiled but not exercised here";
    }
    be_ = make_cuda_backend(0);
  }

  void TearDown() override {
    for (void* p : buffers_) be_->free_buffer(p);
  }

  // A backend (managed) buffer holding v.
  template <class T>
  T* dev(const std::vector<T>& v) {
    T* p = static_cast<T*>(be_->alloc_buffer(v.size() * sizeof(T)));
    buffers_.push_back(p);
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }

  template <class T>
  static std::vector<T> host(const T* p, size_t n) {
    return std::vector<T>(p, p + n);
  }

  std::unique_ptr<Backend> be_;
  std::vector<void*> buffers_;
};

std::vector<int64_t> n_in_cases(DType t) {
  switch (dtype_block_elems(t)) {
    case 1:
      return {1, 13, 40, 300, 1001};  // odd lengths: tails of the per-lane loops
    case 32:
      return {32, 96, 576, 1568};
    default:
      return {256, 768, 1792};
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

// The timing hook of cuda_bench only accepts a CUDA backend.
TEST(CudaNoDevice, MarkNeedsACudaBackend) {
  auto cpu = make_cpu_backend(1);
  try {
    cuda_mark(*cpu);
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
                         const std::vector<double>& abs_sum, const std::string& what) {
  ASSERT_EQ(y.size(), exact.size());
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(static_cast<double>(y[i]) - exact[i]);
    if (!(err <= kMatmulRelTol * abs_sum[i] + 1e-30) && ++bad <= 3) {
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
          // The decode entry point falls back to the same exact product.
          float* y8 = dev(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
          be->matmul_q8(w, dev(x), n_rows, y8);
          expect_matmul_close(host(y8, exact.size()), exact, abs_sum, "matmul_q8");
        }
      }
    }
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
    be_->rope(dx, dev(pos), n_rows, s.n_heads, s.head_dim, s.rot_dim, 10000.0f);
    ref::rope(x.data(), pos.data(), n_rows, s.n_heads, s.head_dim, s.rot_dim, 10000.0f);
    const std::vector<float> got = host(dx, x.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], x[i], 2e-6) << "head_dim " << s.head_dim << " rot_dim " << s.rot_dim;
    }
  }
}

struct AttnCase {
  int64_t n_head, n_head_kv, head_dim, n_kv;
  std::vector<int32_t> q_pos;
};

// Query rows are a subset of positions in any order, including one with a
// negative position (sees no key: zero output) and positions past n_kv
// (see every key); GQA groups of 1, 3 and 4; head sizes that are not a
// multiple of 32; key counts that cross the kernel's 32-key tiles.
// The arguments of one case over host vectors (out left null).
AttentionArgs host_args(const AttnCase& c, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v) {
  AttentionArgs a;
  a.q = q.data();
  a.q_pos = c.q_pos.data();
  a.n_q = static_cast<int64_t>(c.q_pos.size());
  a.k = k.data();
  a.v = v.data();
  a.n_kv = c.n_kv;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return a;
}

TEST_F(Cuda, AttentionMatchesReference) {
  std::mt19937 rng(7);
  const std::vector<AttnCase> cases = {
      {1, 1, 64, 1, {0}},
      {3, 1, 64, 70, {69, 0, 31, 32, 33, 5}},
      {6, 2, 72, 100, {99, 40, -1, 63, 64, 200}},
      {8, 2, 128, 257, {256, 128, 1, 255, 100}},
      {4, 4, 256, 40, {39, 7, 12}},
      {2, 1, 17, 33, {32, 31, 0}},
  };
  for (const AttnCase& c : cases) {
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
    const std::vector<float> q = test::random_floats(rng, n_q * c.n_head * c.head_dim);
    const std::vector<float> k = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    const std::vector<float> v = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    std::vector<float> expect(q.size());
    AttentionArgs a = host_args(c, q, k, v);
    a.out = expect.data();
    ref::attention(a);

    AttentionArgs d = a;
    d.q = dev(q);
    d.q_pos = dev(c.q_pos);
    d.k = dev(k);
    d.v = dev(v);
    d.out = dev(std::vector<float>(q.size(), NAN));
    be_->attention(d);
    const std::vector<float> got = host(d.out, q.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], expect[i], 1e-5) << "heads " << c.n_head << "/" << c.n_head_kv
                                           << " head_dim " << c.head_dim << " at " << i;
    }
  }
}

// The same sums as the CPU backend, from device K/V into host memory.
TEST_F(Cuda, AttentionContributionsMatchCpu) {
  std::mt19937 rng(8);
  const std::vector<AttnCase> cases = {
      {9, 3, 64, 70, {69, 0, 31, 32, 33, 5}},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}},
      {2, 1, 17, 33, {32, 31, 0}},
  };
  for (const AttnCase& c : cases) {
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
    const std::vector<float> q = test::random_floats(rng, n_q * c.n_head * c.head_dim);
    const std::vector<float> k = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    const std::vector<float> v = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    AttentionArgs a = host_args(c, q, k, v);
    std::vector<float> expect(static_cast<size_t>(c.n_kv), 0.0f);
    make_cpu_backend(1, CpuKernelLevel::kScalar)->attention_contributions(a, expect.data());
    AttentionArgs d = a;
    d.q = dev(q);
    d.q_pos = dev(c.q_pos);
    d.k = dev(k);
    d.v = dev(v);
    std::vector<float> got(static_cast<size_t>(c.n_kv), 0.0f);
    be_->attention_contributions(d, got.data());
    for (size_t j = 0; j < got.size(); ++j)
      EXPECT_NEAR(got[j], expect[j], 1e-4 * (1.0 + std::fabs(expect[j]))) << "key " << j;
  }
}

TEST_F(Cuda, AttentionRejectsOversizedHeads) {
  std::vector<float> buf(512, 0.0f);
  const int32_t pos = 0;
  AttentionArgs a;
  a.q = buf.data();
  a.q_pos = &pos;
  a.n_q = 1;
  a.k = buf.data();
  a.v = buf.data();
  a.n_kv = 1;
  a.n_head = 1;
  a.n_head_kv = 1;
  a.head_dim = 512;
  a.scale = 1.0f;
  a.out = buf.data();
  EXPECT_THROW(be_->attention(a), Error);
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

    // add, with out aliasing its first operand (as the runtime's residual).
    ref::add(g.data(), u.data(), n, expect.data());
    float* a = dev(g);
    be_->add(a, dev(u), n, a);
    EXPECT_TRUE(test::bitwise_equal(host(a, expect.size()), expect)) << "add n=" << n;
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
  be_->rope(r.data(), pos.data(), 2, 1, 64, 64, 10000.0f);
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
    be_->rope(r.data(), pos.data(), n_rows, 1, dim, dim, 10000.0f);
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
  EXPECT_THROW(be_->rope(nullptr, nullptr, 1, 1, 8, 9, 10000.0f), Error);
}

// ---------------------------------------------------------------- top_k --

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

// --------------------------------------------------------------- batches --

std::unique_ptr<Backend> cuda_backend(CudaZeroCopy zc) {
  CudaBackendOptions o;
  o.zero_copy = zc;
  return make_cuda_backend(0, o);
}

// A long chain of dependent ops, a transformer layer's worth per iteration:
// rmsnorm with a host weight vector (mirror path), matmul (GEMV for 5 rows,
// dequantize + SGEMM for 24), rope with host positions, silu_mul, matmul,
// add of a host bias (staged: past the 64 KiB mirror limit for 24 rows),
// residual add in place, gather with host indices, row_sq_diff, top_k into
// a host vector, and every 8 iterations a logits row into a host vector.
// Every host input is scribbled over as soon as its op returns: the op must
// already hold the values.  Batched and unbatched runs issue the same
// kernels in the same order, so their results are bitwise equal.
class Chain {
 public:
  static constexpr int64_t kD = 1024, kD2 = 512, kHeads = 8, kHeadDim = 64, kVocab = 300;

  Chain(Backend& be, int64_t rows, uint32_t seed) : be_(be), rows_(rows) {
    std::mt19937 rng(seed);
    wa_ = prepare(rng, DType::Q4_0, kD2, kD);
    wb_ = prepare(rng, DType::Q4_1, kD, kD2);
    wout_ = prepare(rng, DType::Q8_0, kVocab, kD);
    norm_ = test::random_floats(rng, kD);
    x0_ = test::random_floats(rng, rows_ * kD);
    h_ = buffer(rows_ * kD);
    t1_ = buffer(rows_ * kD);
    t2_ = buffer(rows_ * kD2);
    t3_ = buffer(rows_ * kD2);
    t4_ = buffer(rows_ * kD);
    g_ = buffer(rows_ * kD);
    sq_ = buffer(rows_);
  }
  Chain(const Chain&) = delete;
  Chain& operator=(const Chain&) = delete;
  ~Chain() {
    for (void* p : buffers_) be_.free_buffer(p);
  }

  struct Result {
    std::vector<float> h;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> picks;
  };

  // batched: the whole run is one batch; nested: one iteration in the
  // middle is an inner batch as well.  The caller's thread must not have a
  // batch open when batched is false.
  Result run(int iters, bool batched, bool nested = false) {
    std::memcpy(h_, x0_.data(), x0_.size() * sizeof(float));  // no batch open: host may write
    Result r;
    const int64_t R = rows_;
    std::vector<int32_t> pos(static_cast<size_t>(R)), idx(static_cast<size_t>(R)), pick(2);
    std::vector<float> bias(static_cast<size_t>(R * kD)), logits(kVocab);
    if (batched) be_.begin_batch();
    for (int it = 0; it < iters; ++it) {
      const bool inner = nested && it == iters / 2;
      if (inner) be_.begin_batch();
      be_.rmsnorm(h_, norm_.data(), R, kD, 1e-5f, t1_);
      be_.matmul(wa_, t1_, R, t2_);
      for (int64_t i = 0; i < R; ++i) pos[i] = static_cast<int32_t>(it * 13 + 3 * i);
      be_.rope(t2_, pos.data(), R, kHeads, kHeadDim, kHeadDim, 10000.0f);
      std::fill(pos.begin(), pos.end(), -7);
      be_.silu_mul(t2_, t2_, R * kD2, t3_);
      be_.matmul(wb_, t3_, R, t4_);
      for (size_t j = 0; j < bias.size(); ++j) bias[j] = 0.01f * static_cast<float>((it + j) % 17);
      be_.add(t4_, bias.data(), R * kD, t4_);
      std::fill(bias.begin(), bias.end(), 1e6f);
      be_.add(h_, t4_, R * kD, h_);
      for (int64_t i = 0; i < R; ++i) idx[i] = static_cast<int32_t>((i * 5 + it) % R);
      be_.gather_rows(h_, kD, idx.data(), R, g_);
      std::fill(idx.begin(), idx.end(), -1);
      be_.row_sq_diff(h_, g_, R, kD, sq_);
      be_.top_k(sq_, R, 2, pick.data());
      r.picks.push_back(pick);
      if (it % 8 == 7) {
        be_.matmul(wout_, h_ + (R - 1) * kD, 1, logits.data());
        r.logits.push_back(logits);
      }
      if (inner) be_.end_batch();
    }
    if (batched) be_.end_batch();
    r.h.assign(h_, h_ + R * kD);
    return r;
  }

 private:
  WeightView prepare(std::mt19937& rng, DType t, int64_t n_out, int64_t n_in) {
    const std::vector<uint8_t> bytes = test::random_weight(rng, t, n_out, n_in);
    return be_.prepare_weight({bytes.data(), t, n_in, n_out});  // copies: bytes may go
  }
  float* buffer(int64_t n) {
    auto* p = static_cast<float*>(be_.alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    buffers_.push_back(p);
    return p;
  }

  Backend& be_;
  int64_t rows_;
  WeightView wa_, wb_, wout_;
  std::vector<float> norm_, x0_;
  float *h_, *t1_, *t2_, *t3_, *t4_, *g_, *sq_;
  std::vector<void*> buffers_;
};

void expect_same(const Chain::Result& a, const Chain::Result& b, const std::string& what) {
  EXPECT_TRUE(test::bitwise_equal(a.h, b.h)) << what << ": final activations differ";
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(a.logits[i], b.logits[i])) << what << ": logits " << i;
  }
  EXPECT_EQ(a.picks, b.picks) << what << ": top_k picks";
  for (float x : a.h) {
    ASSERT_TRUE(std::isfinite(x)) << what << ": the chain overflowed";
  }
}

TEST_F(Cuda, BatchGivesTheSameResultsAsSeparateOps) {
  for (CudaZeroCopy zc : {CudaZeroCopy::kOff, CudaZeroCopy::kOn}) {
    auto be = cuda_backend(zc);
    for (int64_t rows : {5, 24}) {
      Chain chain(*be, rows, 30);
      const std::string what = std::string(zc == CudaZeroCopy::kOn ? "zero-copy" : "managed") +
                               " rows=" + std::to_string(rows);
      const Chain::Result plain = chain.run(40, false);
      const Chain::Result batched = chain.run(40, true);
      expect_same(batched, plain, what + " batched");
      const Chain::Result nested = chain.run(40, true, true);
      expect_same(nested, plain, what + " nested");
      // Again after the batches: nothing of them is left half done.
      expect_same(chain.run(40, false), plain, what + " unbatched again");
    }
  }
}

TEST_F(Cuda, UnbalancedEndBatchIsAnError) {
  try {
    be_->end_batch();
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  be_->begin_batch();
  be_->begin_batch();
  be_->end_batch();
  be_->end_batch();
  EXPECT_THROW(be_->end_batch(), Error);
}

// An op that fails inside a batch leaves the batch usable: the ops before
// it still complete at end_batch, and later ops work.
TEST_F(Cuda, ErrorInsideABatchLeavesItUsable) {
  std::mt19937 rng(22);
  const int64_t n = 1000;
  const std::vector<float> a = test::random_floats(rng, n), b = test::random_floats(rng, n);
  std::vector<float> expect(static_cast<size_t>(n));
  ref::add(a.data(), b.data(), n, expect.data());
  float* out = dev(std::vector<float>(static_cast<size_t>(n)));
  be_->begin_batch();
  be_->add(dev(a), dev(b), n, out);
  EXPECT_THROW(be_->rope(out, nullptr, 1, 1, 8, 9, 10000.0f), Error);
  be_->end_batch();
  EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect));
  be_->add(out, dev(std::vector<float>(static_cast<size_t>(n), 0.0f)), n, out);
  EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect));
}

// --------------------------------------------------------------- uploads --

TEST_F(Cuda, StagedUploadsOnlyWithoutZeroCopy) {
  EXPECT_TRUE(cuda_backend(CudaZeroCopy::kOff)->wants_staged_uploads());
  EXPECT_FALSE(cuda_backend(CudaZeroCopy::kOn)->wants_staged_uploads());
}

// upload() from page-locked staging and from ordinary (pageable) memory;
// a later op of the same thread outside a batch sees the data, and so does
// the host once that op has returned.
TEST_F(Cuda, UploadedDataIsSeenByTheNextOp) {
  std::mt19937 rng(23);
  for (CudaZeroCopy zc : {CudaZeroCopy::kOff, CudaZeroCopy::kOn}) {
    auto be = cuda_backend(zc);
    const std::string what = zc == CudaZeroCopy::kOn ? "zero-copy" : "managed";
    const int64_t n = int64_t{1} << 20;
    auto* buf = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    auto* zeros = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    auto* out = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    std::memset(buf, 0, n * sizeof(float));
    std::memset(zeros, 0, n * sizeof(float));
    const std::vector<float> a = test::random_floats(rng, n);
    auto* staging = static_cast<float*>(be->alloc_host_staging(n * sizeof(float)));
    std::memcpy(staging, a.data(), n * sizeof(float));
    be->upload(buf, staging, n * sizeof(float));
    be->add(buf, zeros, n, out);
    EXPECT_TRUE(test::bitwise_equal(host(out, a.size()), a)) << what << " from staging";

    // Pageable source, into the middle and up to the very end of the buffer.
    const std::vector<float> b = test::random_floats(rng, 1000);
    std::vector<float> expect = a;
    std::copy(b.begin(), b.end(), expect.begin() + 100);
    std::copy(b.begin(), b.end(), expect.end() - 1000);
    be->upload(buf + 100, b.data(), b.size() * sizeof(float));
    be->upload(buf + n - 1000, b.data(), b.size() * sizeof(float));
    be->upload(buf, b.data(), 0);  // nothing
    be->add(buf, zeros, n, out);
    EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect)) << what << " pageable";
    EXPECT_TRUE(test::bitwise_equal(host(buf, expect.size()), expect)) << what << " host view";
    EXPECT_GE(be->wait_uploads(), 0.0);
    be->free_host_staging(staging);
    for (float* p : {buf, zeros, out}) be->free_buffer(p);
  }
}

// The copy time comes from GPU events: positive after 64 MiB, and only the
// copies since the previous call count.  300 small uploads exercise the
// folding of completed copies (the event list is bounded).
TEST_F(Cuda, WaitUploadsReturnsTheCopyTime) {
  be_ = cuda_backend(CudaZeroCopy::kOff);  // a copy the GPU does, also on Jetson
  const size_t bytes = size_t{64} << 20;
  auto* buf = static_cast<unsigned char*>(be_->alloc_buffer(bytes));
  auto* staging = static_cast<unsigned char*>(be_->alloc_host_staging(bytes));
  for (size_t i = 0; i < bytes; ++i) staging[i] = static_cast<unsigned char>(i * 7 + 1);
  EXPECT_EQ(be_->wait_uploads(), 0.0) << "no upload yet";
  be_->upload(buf, staging, bytes);
  const double ms = be_->wait_uploads();
  std::printf("64 MiB upload from staging: %.3f ms (%.1f GB/s)\n", ms,
              static_cast<double>(bytes) / (ms * 1e6));
  EXPECT_GT(ms, 0.0);
  EXPECT_EQ(be_->wait_uploads(), 0.0) << "already counted";
  EXPECT_EQ(std::memcmp(buf, staging, bytes), 0);

  const size_t piece = bytes / 300;
  for (size_t i = 0; i < 300; ++i) {
    std::memset(staging + i * piece, static_cast<int>(i % 251), piece);
    be_->upload(buf + i * piece, staging + i * piece, piece);
  }
  EXPECT_GT(be_->wait_uploads(), 0.0);
  for (size_t i = 0; i < 300; i += 37) {
    EXPECT_EQ(buf[i * piece], static_cast<unsigned char>(i % 251)) << i;
    EXPECT_EQ(buf[i * piece + piece - 1], static_cast<unsigned char>(i % 251)) << i;
  }
  be_->free_host_staging(staging);
  be_->free_buffer(buf);
}

// What the layerwise loader does: per chunk, K and V rows read into staging,
// uploaded into the KV cache rows, K rotated to the chunk's global
// positions -- on its own thread, while the main thread runs a long batch
// on other buffers.  Both sides must give exactly what they give alone.
TEST_F(Cuda, LoaderThreadUploadsBesideABatch) {
  constexpr int64_t kChunks = 8, kChunkRows = 64, kHeadsKv = 3, kHeadDim = 64;
  constexpr int64_t kKvDim = kHeadsKv * kHeadDim, kRows = kChunks * kChunkRows;
  std::mt19937 rng(24);
  const std::vector<float> k_src = test::random_floats(rng, kRows * kKvDim);
  const std::vector<float> v_src = test::random_floats(rng, kRows * kKvDim);
  // Managed memory beside running kernels needs concurrent managed access,
  // which integrated GPUs (where kAuto means zero-copy) do not have.
  const bool integrated = !cuda_backend(CudaZeroCopy::kAuto)->wants_staged_uploads();
  for (CudaZeroCopy zc : {CudaZeroCopy::kOff, CudaZeroCopy::kOn}) {
    if (zc == CudaZeroCopy::kOff && integrated) {
      std::printf("integrated GPU: the managed-memory case is not run\n");
      continue;
    }
    auto be = cuda_backend(zc);
    const std::string what = zc == CudaZeroCopy::kOn ? "zero-copy" : "managed";
    const size_t kv_bytes = static_cast<size_t>(kRows * kKvDim) * sizeof(float);
    auto* kc = static_cast<float*>(be->alloc_buffer(kv_bytes));
    auto* vc = static_cast<float*>(be->alloc_buffer(kv_bytes));

    // The loader's work; `staged` picks staging memory or writing straight
    // into the cache (the zero-copy way) for the data.
    auto load = [&](bool staged) -> double {
      const size_t chunk_bytes = static_cast<size_t>(kChunkRows * kKvDim) * sizeof(float);
      auto* sk = static_cast<float*>(be->alloc_host_staging(chunk_bytes));
      auto* sv = static_cast<float*>(be->alloc_host_staging(chunk_bytes));
      std::vector<int32_t> pos(kChunkRows);
      for (int64_t c = 0; c < kChunks; ++c) {
        const int64_t row0 = c * kChunkRows;
        const float* ks = k_src.data() + row0 * kKvDim;
        const float* vs = v_src.data() + row0 * kKvDim;
        if (staged) {
          std::memcpy(sk, ks, chunk_bytes);
          std::memcpy(sv, vs, chunk_bytes);
          be->upload(kc + row0 * kKvDim, sk, chunk_bytes);
          be->upload(vc + row0 * kKvDim, sv, chunk_bytes);
        } else {
          std::memcpy(kc + row0 * kKvDim, ks, chunk_bytes);
          std::memcpy(vc + row0 * kKvDim, vs, chunk_bytes);
        }
        for (int64_t i = 0; i < kChunkRows; ++i) pos[i] = static_cast<int32_t>(row0 + 3 + i);
        be->rope(kc + row0 * kKvDim, pos.data(), kChunkRows, kHeadsKv, kHeadDim, kHeadDim,
                 100000.0f);
        // The rope returned: both copies (queued before it) are done, so the
        // staging memory may be refilled for the next chunk.
      }
      const double ms = be->wait_uploads();
      be->free_host_staging(sk);
      be->free_host_staging(sv);
      return ms;
    };

    // Alone first (the reference for both sides), on this thread.
    Chain chain(*be, 24, 31);
    const Chain::Result chain_alone = chain.run(40, false);
    load(true);
    const std::vector<float> k_alone = host(kc, k_src.size());
    EXPECT_TRUE(test::bitwise_equal(host(vc, v_src.size()), v_src)) << what;
    std::vector<float> k_ref = k_src;
    for (int64_t c = 0; c < kChunks; ++c) {
      std::vector<int32_t> pos(kChunkRows);
      for (int64_t i = 0; i < kChunkRows; ++i)
        pos[i] = static_cast<int32_t>(c * kChunkRows + 3 + i);
      ref::rope(k_ref.data() + c * kChunkRows * kKvDim, pos.data(), kChunkRows, kHeadsKv, kHeadDim,
                kHeadDim, 100000.0f);
    }
    for (size_t i = 0; i < k_ref.size(); ++i) {
      ASSERT_NEAR(k_alone[i], k_ref[i], 2e-6) << what << " K element " << i;
    }

    // Writing straight into the cache while kernels run is what zero-copy
    // buffers allow (wants_staged_uploads() false); managed ones get staging.
    for (bool staged : {true, false}) {
      if (!staged && be->wants_staged_uploads()) continue;
      std::memset(kc, 0, kv_bytes);
      std::memset(vc, 0, kv_bytes);
      std::latch start(2);
      double copy_ms = -1.0;
      std::thread loader([&] {
        start.arrive_and_wait();
        copy_ms = load(staged);
      });
      start.arrive_and_wait();
      const Chain::Result together = chain.run(40, true);
      loader.join();
      const std::string w = what + (staged ? " staged" : " direct");
      expect_same(together, chain_alone, w + " main thread");
      EXPECT_TRUE(test::bitwise_equal(host(kc, k_src.size()), k_alone)) << w << " K";
      EXPECT_TRUE(test::bitwise_equal(host(vc, v_src.size()), v_src)) << w << " V";
      // Copies between host buffers (staging into zero-copy memory) may be
      // done by the CPU inside upload(), outside the timed events.
      if (!staged) {
        EXPECT_EQ(copy_ms, 0.0) << w;
      } else if (zc == CudaZeroCopy::kOff) {
        EXPECT_GT(copy_ms, 0.0) << w;
      } else {
        EXPECT_GE(copy_ms, 0.0) << w;
      }
    }
    be->free_buffer(kc);
    be->free_buffer(vc);
  }
}

// Threads come and go (the fusor starts a loader per request): each new
// thread's calls work, and a thread's leftover state does not leak into the
// next one that gets its stream.
TEST_F(Cuda, ShortLivedThreadsEachWork) {
  std::mt19937 rng(25);
  const int64_t n = 4096;
  const std::vector<float> a = test::random_floats(rng, n);
  float* src = dev(a);
  for (int t = 0; t < 24; ++t) {
    float* out = dev(std::vector<float>(static_cast<size_t>(n), 0.0f));
    const std::vector<float> b = test::random_floats(rng, n);
    std::vector<float> expect(static_cast<size_t>(n));
    ref::add(a.data(), b.data(), n, expect.data());
    std::thread th([&] {
      float* tmp = static_cast<float*>(be_->alloc_buffer(n * sizeof(float)));
      be_->upload(tmp, b.data(), n * sizeof(float));
      if (t % 3 == 0) {
        // Left open on purpose: the thread ends inside a batch.  The top_k
        // into host memory waits for the add; if the open batch leaked into
        // the next thread, that thread's add would return unfinished.
        be_->begin_batch();
        be_->add(src, tmp, n, out);
        int32_t pick = -1;
        be_->top_k(out, n, 1, &pick);
        EXPECT_GE(pick, 0);
      } else {
        be_->add(src, tmp, n, out);
      }
      // (Zero-copy, the default on an integrated GPU, may copy on the CPU.)
      EXPECT_GE(be_->wait_uploads(), be_->wants_staged_uploads() ? 1e-9 : 0.0);
      be_->free_buffer(tmp);
    });
    th.join();
    EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect)) << "thread " << t;
  }
}

// ------------------------------------------------------------- zero-copy --

// Forced zero-copy on any GPU: host writes into buffers that ops read, ops
// write buffers the host reads after the op (or the batch) returns, and the
// host may write a buffer that no queued op uses while a batch runs.
TEST_F(Cuda, ZeroCopyBuffersAreSharedWithTheHost) {
  auto be = cuda_backend(CudaZeroCopy::kOn);
  std::mt19937 rng(26);
  const int64_t dim = 576, n_rows = 7;
  const std::vector<float> x = test::random_floats(rng, n_rows * dim);
  const std::vector<float> wt = test::random_floats(rng, dim);
  auto alloc = [&](int64_t n) {
    auto* p = static_cast<float*>(be->alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    return p;
  };
  float* dx = alloc(n_rows * dim);
  float* dw = alloc(dim);
  float* dout = alloc(n_rows * dim);
  std::memcpy(dx, x.data(), x.size() * sizeof(float));
  std::memcpy(dw, wt.data(), wt.size() * sizeof(float));
  std::vector<float> expect(x.size());
  ref::rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-5f, expect.data());
  be->rmsnorm(dx, dw, n_rows, dim, 1e-5f, dout);
  for (size_t i = 0; i < expect.size(); ++i) {
    ASSERT_NEAR(dout[i], expect[i], 1e-6 * (1.0 + std::fabs(expect[i]))) << i;
  }

  // Matmul both paths, weight in device memory, activations zero-copy.
  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q4_K, 40, dim - 64);
  const WeightView hw{data.data(), DType::Q4_K, dim - 64, 40};
  const WeightView w = be->prepare_weight(hw);
  for (int64_t rows : {int64_t{1}, n_rows}) {
    std::vector<float> y_ref(static_cast<size_t>(rows * 40));
    std::vector<float> xin(x.begin(), x.begin() + rows * (dim - 64));
    ref::matmul(hw, xin.data(), rows, y_ref.data());
    float* xi = alloc(rows * (dim - 64));
    float* y = alloc(rows * 40);
    std::memcpy(xi, xin.data(), xin.size() * sizeof(float));
    be->matmul(w, xi, rows, y);
    for (size_t i = 0; i < y_ref.size(); ++i) {
      ASSERT_NEAR(y[i], y_ref[i], 1e-3 * (1.0 + std::fabs(y_ref[i]))) << "rows " << rows;
    }
  }

  // While a batch is queued on A, the host fills B; B is read afterwards.
  const int64_t big = int64_t{1} << 22;
  float* a = alloc(big);
  float* b = alloc(big);
  float* c = alloc(big);
  std::fill(a, a + big, 1.0f);
  be->begin_batch();
  for (int i = 0; i < 20; ++i) be->add(a, a, big, a);  // a = 2^20
  for (int64_t i = 0; i < big; ++i) b[i] = static_cast<float>(i % 1000);
  be->end_batch();
  be->add(a, b, big, c);
  for (int64_t i = 0; i < big; i += 4099) {
    ASSERT_EQ(c[i], 1048576.0f + static_cast<float>(i % 1000)) << i;
  }
  for (float* p : {dx, dw, dout, a, b, c}) be->free_buffer(p);

  try {
    be->alloc_buffer(std::numeric_limits<size_t>::max() / 2);
    FAIL() << "expected kOutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
}

// ---------------------------------------------------- invalid arguments --

TEST_F(Cuda, RejectsBadUploadsAndFrees) {
  auto expect_code = [](ErrorCode code, const char* what, auto&& f) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    }
  };
  const size_t n = 256;
  auto* buf = static_cast<float*>(be_->alloc_buffer(n * sizeof(float)));
  std::vector<float> host_mem(n, 1.0f);
  expect_code(ErrorCode::kInvalidArgument, "upload to host memory",
              [&] { be_->upload(host_mem.data(), host_mem.data(), 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload to null",
              [&] { be_->upload(nullptr, buf, 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload from null",
              [&] { be_->upload(buf, nullptr, 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload past the end",
              [&] { be_->upload(buf + n - 1, host_mem.data(), 2 * sizeof(float)); });
  expect_code(ErrorCode::kInvalidArgument, "free of host memory",
              [&] { be_->free_buffer(host_mem.data()); });
  expect_code(ErrorCode::kInvalidArgument, "free inside a buffer",
              [&] { be_->free_buffer(buf + 1); });
  expect_code(ErrorCode::kInvalidArgument, "free_host_staging of other memory",
              [&] { be_->free_host_staging(host_mem.data()); });
  expect_code(ErrorCode::kOutOfMemory, "huge staging",
              [&] { be_->alloc_host_staging(std::numeric_limits<size_t>::max() / 2); });
  expect_code(ErrorCode::kInvalidArgument, "scatter into pageable memory", [&] {
    const int32_t idx = 0;
    be_->scatter_rows(buf, 4, &idx, 1, host_mem.data());
  });
  EXPECT_NO_THROW(be_->free_host_staging(nullptr));
  EXPECT_NO_THROW(be_->upload(buf, host_mem.data(), 0));
  be_->free_buffer(buf);
}

}  // namespace
}  // namespace cb
