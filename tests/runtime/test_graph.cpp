#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "platform/error.h"
#include "runtime/graph.h"
#include "tests/runtime/counting_backends.h"

namespace cb {
namespace {

// A chain of ops over distinct shapes: the arena must be smaller than the sum
// of all intermediates (memory is reused) and the result must equal running
// the same ops one by one into separate buffers.
TEST(Graph, PlannerReusesMemoryWithoutCorruptingLiveTensors) {
  auto be = make_cpu_backend(1, CpuKernelLevel::kScalar);
  const int64_t rows = 3, dim = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * dim), w(dim, 1.0f), wmat(dim * dim);
  for (float& v : x) v = nd(rng);
  for (float& v : wmat) v = nd(rng) * 0.1f;
  WeightView W{wmat.data(), DType::F32, dim, dim};

  Graph g;
  TensorId in = g.external(x.data(), rows, dim);
  TensorId a = g.rmsnorm(in, w.data(), 1e-5f);
  TensorId keep = g.matmul(W, a);  // stays live until the end
  TensorId t = keep;
  for (int i = 0; i < 8; ++i) t = g.silu_mul(g.matmul(W, t), t);
  g.add_into(t, keep);
  std::vector<float> out(rows * dim);
  TensorId o = g.external(out.data(), rows, dim);
  std::vector<int32_t> idx = {0, 1, 2};
  g.scatter_rows(t, idx.data(), o);
  size_t arena_bytes = g.plan();
  const size_t one = rows * dim * sizeof(float);
  EXPECT_LT(arena_bytes, 8 * one);  // 19 intermediates, a handful live at once
  std::vector<float> arena(arena_bytes / sizeof(float) + 16);
  g.execute(*be, arena.data());

  std::vector<float> ra(rows * dim), rkeep(rows * dim), rt(rows * dim), tmp(rows * dim);
  be->rmsnorm(x.data(), w.data(), rows, dim, 1e-5f, ra.data());
  be->matmul(W, ra.data(), rows, rkeep.data());
  rt = rkeep;
  for (int i = 0; i < 8; ++i) {
    be->matmul(W, rt.data(), rows, tmp.data());
    be->silu_mul(tmp.data(), rt.data(), rows * dim, rt.data());
  }
  be->add(rt.data(), rkeep.data(), rows * dim, rt.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_FLOAT_EQ(out[i], rt[i]) << i;
}

TEST(Graph, ExecutesNodeRanges) {
  auto be = make_cpu_backend(1, CpuKernelLevel::kScalar);
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  Graph g;
  TensorId ta = g.external(a.data(), 2, 2);
  TensorId tb = g.external(b.data(), 2, 2);
  g.add_into(ta, tb);
  g.add_into(ta, tb);
  g.plan();
  g.execute(*be, nullptr, 0, 1);
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33, 44}));
  g.execute(*be, nullptr, 1);
  EXPECT_EQ(a, (std::vector<float>{21, 42, 63, 84}));
}

// Counts batches, and optionally fails an op and the end of the batch.
class BatchCountingBackend final : public test::CountingBackend {
 public:
  BatchCountingBackend() : CountingBackend(1) {}
  void begin_batch() override {
    ++begins;
    ++depth;
  }
  void end_batch() override {
    ++ends;
    --depth;
    if (fail_end) throw std::runtime_error("end_batch failed too");
  }
  void add(const float* a, const float* b, int64_t n, float* out) override {
    if (fail_add) fail(ErrorCode::kInternal, "add failed");
    CountingBackend::add(a, b, n, out);
  }
  int begins = 0, ends = 0, depth = 0, ops_outside = 0;
  bool fail_add = false, fail_end = false;

 private:
  void before_op(BackendOp) override { ops_outside += depth == 0; }
};

TEST(Graph, ExecuteIsOneBatchBalancedAlsoWhenAnOpThrows) {
  BatchCountingBackend be;
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40}, w = {1, 1};
  Graph g;
  TensorId ta = g.external(a.data(), 2, 2);
  g.add_into(ta, g.external(b.data(), 2, 2));
  g.add_into(ta, g.rmsnorm(ta, w.data(), 1e-5f));
  std::vector<float> arena(g.plan() / sizeof(float) + 16);
  g.execute(be, arena.data());
  EXPECT_EQ(be.begins, 1);
  EXPECT_EQ(be.ends, 1);
  EXPECT_EQ(be.ops_outside, 0);
  g.execute(be, arena.data(), 1, 2);  // a range is one batch too
  EXPECT_EQ(be.begins, 2);
  EXPECT_EQ(be.ends, 2);

  // The op's error comes out, the batch is ended, and a second error from
  // ending it is dropped.
  be.fail_add = true;
  for (bool fail_end : {false, true}) {
    be.fail_end = fail_end;
    try {
      g.execute(be, arena.data());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
    }
    EXPECT_EQ(be.depth, 0);
    EXPECT_EQ(be.begins, be.ends);
  }
  // Without an op error, end_batch()'s own error is reported.
  be.fail_add = false;
  EXPECT_THROW(g.execute(be, arena.data()), std::runtime_error);
  EXPECT_EQ(be.begins, be.ends);
}

// A bias added straight after the product that wrote it joins that node
// (one matmul_bias call, bitwise the two ops); anywhere else it stays an
// add_bias of its own.
class BiasCountingBackend : public test::CountingBackend {
 public:
  int fused = 0, separate = 0;
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    ++fused;
    Backend::matmul_bias(w, x, n_rows, bias, y, q8);
  }
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    ++separate;
    CountingBackend::add_bias(x, bias, n_rows, dim);
  }
};

TEST(Graph, BiasJoinsTheProductThatWroteIt) {
  const int64_t rows = 2, dim = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * dim), wmat(dim * dim), bias(dim);
  for (float& v : x) v = nd(rng);
  for (float& v : wmat) v = nd(rng);
  for (float& v : bias) v = nd(rng);
  const WeightView W{wmat.data(), DType::F32, dim, dim};
  std::vector<float> fused_out(rows * dim), late_out(rows * dim);
  std::vector<int32_t> idx = {0, 1};
  Graph g;
  TensorId in = g.external(x.data(), rows, dim);
  TensorId p = g.matmul(W, in);
  g.add_bias(p, bias.data());
  g.scatter_rows(p, idx.data(), g.external(fused_out.data(), rows, dim));
  TensorId q = g.matmul(W, in);
  g.scale(q, 1.0f);
  g.add_bias(q, bias.data());  // not straight after its product
  g.scatter_rows(q, idx.data(), g.external(late_out.data(), rows, dim));
  std::vector<float> arena(g.plan() / sizeof(float) + 16);
  BiasCountingBackend be;
  g.execute(be, arena.data());
  EXPECT_EQ(be.fused, 1);
  EXPECT_EQ(be.separate, 2);  // the fused node's default, and the late one
  auto cpu = make_cpu_backend(1);
  std::vector<float> expect(rows * dim);
  cpu->matmul(W, x.data(), rows, expect.data());
  cpu->add_bias(expect.data(), bias.data(), rows, dim);
  EXPECT_TRUE(std::memcmp(fused_out.data(), expect.data(), expect.size() * sizeof(float)) == 0);
  EXPECT_TRUE(std::memcmp(late_out.data(), expect.data(), expect.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace cb
