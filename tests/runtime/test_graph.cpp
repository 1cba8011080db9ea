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
  for (int i = 0; i < 8; ++i) t = g.matmul_gated(W, g.matmul(W, t), t, ProductArgs::Gate::kSilu);
  g.add_into(t, keep);
  std::vector<float> out(rows * dim);
  TensorId o = g.external(out.data(), rows, dim);
  std::vector<int32_t> idx = {0, 1, 2};
  g.scatter_rows(t, idx.data(), o);
  size_t arena_bytes = g.plan();
  const size_t one = rows * dim * sizeof(float);
  EXPECT_LT(arena_bytes, 8 * one);  // 18 intermediates, a handful live at once
  std::vector<float> arena(arena_bytes / sizeof(float) + 16);
  g.execute(*be, arena.data());

  std::vector<float> ra(rows * dim), rkeep(rows * dim), rt(rows * dim), tmp(rows * dim);
  be->rmsnorm(x.data(), w.data(), rows, dim, 1e-5f, ra.data());
  be->matmul(W, ra.data(), rows, rkeep.data());
  rt = rkeep;
  for (int i = 0; i < 8; ++i) {
    be->matmul(W, rt.data(), rows, tmp.data());
    be->silu_mul(tmp.data(), rt.data(), rows * dim, tmp.data());
    be->matmul(W, tmp.data(), rows, rt.data());
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

// A residual branch's output projection (dst += W x) and a gated
// feed-forward's down projection (W (act(gate) * up), into dst or a new
// tensor) are one Backend::product each, whose default is the ops they
// replace, bit for bit; a bias after an accumulating product stays an op of
// its own (it is added to the sum, not to the product).  Consecutive plain
// products of one input go to Backend::products together.
class ProductCountingBackend : public test::CountingBackend {
 public:
  int product_calls = 0, q8_product_calls = 0, joined_biases = 0, biases = 0;
  std::vector<int64_t> runs;  // each products() call: how many products
  // product() calls (a products() call's included)
  void products(const ProductArgs* a, int64_t n) override {
    runs.push_back(n);
    Backend::products(a, n);
  }
  void product(const ProductArgs& a) override {
    ++product_calls;
    q8_product_calls += a.q8 ? 1 : 0;
    EXPECT_TRUE(!a.accumulate || (a.scratch != nullptr && a.scratch != a.y));
    Backend::product(a);
  }
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    ++joined_biases;
    CountingBackend::matmul_bias(w, x, n_rows, bias, y, q8);
  }
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    ++biases;
    CountingBackend::add_bias(x, bias, n_rows, dim);
  }
};

TEST(Graph, FusedProductsAreTheirOpsOneByOne) {
  const int64_t rows = 3, dim = 16, ffn = 24;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  auto filled = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = nd(rng);
    return v;
  };
  std::vector<float> x = filled(rows * dim), resid = filled(rows * dim);
  const std::vector<float> wo = filled(dim * dim), wg = filled(ffn * dim), wu = filled(ffn * dim),
                           wd = filled(dim * ffn), bias = filled(dim);
  const WeightView Wo{wo.data(), DType::F32, dim, dim}, Wg{wg.data(), DType::F32, dim, ffn},
      Wu{wu.data(), DType::F32, dim, ffn}, Wd{wd.data(), DType::F32, ffn, dim};
  for (Graph::Precision p : {Graph::Precision::kF32, Graph::Precision::kInt8Activations}) {
    std::vector<float> r = resid, gelu_out(rows * dim);
    Graph g;
    const TensorId in = g.external(x.data(), rows, dim), tr = g.external(r.data(), rows, dim);
    g.matmul_add_into(Wo, in, tr, p);  // r += Wo x
    g.add_bias(tr, bias.data());       // r += bias, after the sum
    g.matmul_gated(Wd, g.matmul(Wg, tr, p), g.matmul(Wu, tr, p), ProductArgs::Gate::kSilu, p, tr);
    const TensorId h = g.matmul_gated(Wd, g.matmul(Wg, tr, p), g.matmul(Wu, tr, p),
                                      ProductArgs::Gate::kGeluTanh, p);
    g.add_bias(h, bias.data());  // joins the product that wrote h
    const std::vector<int32_t> idx = {0, 1, 2};
    g.scatter_rows(h, idx.data(), g.external(gelu_out.data(), rows, dim));
    std::vector<float> arena(g.plan() / sizeof(float) + 16);
    ProductCountingBackend be;
    g.execute(be, arena.data());
    // Three fused, and each gate and up pair (one input) as one products().
    EXPECT_EQ(be.product_calls, 7);
    EXPECT_EQ(be.q8_product_calls, p == Graph::Precision::kF32 ? 0 : 7);
    EXPECT_EQ(be.runs, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(be.joined_biases, 1);  // h's
    EXPECT_EQ(be.biases, 1);         // the one after the sum

    auto cpu = make_cpu_backend(1);
    const bool q8 = p != Graph::Precision::kF32;
    auto mm = [&](const WeightView& w, const float* a, float* out) {
      q8 ? cpu->matmul_q8(w, a, rows, out) : cpu->matmul(w, a, rows, out);
    };
    std::vector<float> want = resid, t(rows * dim), gate(rows * ffn), up(rows * ffn);
    mm(Wo, x.data(), t.data());
    cpu->add(want.data(), t.data(), rows * dim, want.data());
    cpu->add_bias(want.data(), bias.data(), rows, dim);
    mm(Wg, want.data(), gate.data());
    mm(Wu, want.data(), up.data());
    cpu->silu_mul(gate.data(), up.data(), rows * ffn, gate.data());
    mm(Wd, gate.data(), t.data());
    cpu->add(want.data(), t.data(), rows * dim, want.data());
    mm(Wg, want.data(), gate.data());
    mm(Wu, want.data(), up.data());
    cpu->gelu_mul(gate.data(), up.data(), rows * ffn, gate.data());
    std::vector<float> want_gelu(rows * dim);
    mm(Wd, gate.data(), want_gelu.data());
    cpu->add_bias(want_gelu.data(), bias.data(), rows, dim);
    EXPECT_TRUE(std::memcmp(r.data(), want.data(), want.size() * sizeof(float)) == 0);
    EXPECT_TRUE(std::memcmp(gelu_out.data(), want_gelu.data(), want.size() * sizeof(float)) == 0);
  }
}

// Which consecutive products go to Backend::products together: plain ones
// (no gate, no accumulation) of one input with distinct outputs, at most
// four, within the range being run; the results are the ops one by one.
TEST(Graph, ProductsOfOneInputRunTogether) {
  const int64_t rows = 2, dim = 8;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * dim), wmat(dim * dim), y(rows * dim);
  for (float& v : x) v = nd(rng);
  for (float& v : wmat) v = nd(rng);
  const WeightView W{wmat.data(), DType::F32, dim, dim};
  Graph g;
  const TensorId in = g.external(x.data(), rows, dim), out = g.external(y.data(), rows, dim);
  const TensorId a = g.matmul(W, in), b = g.matmul(W, in), c = g.matmul(W, in);  // 3 together
  const TensorId d = g.matmul(W, a);                                             // another input
  g.matmul_add_into(W, in, d);                                                   // accumulating
  std::vector<TensorId> five;
  for (int i = 0; i < 5; ++i) five.push_back(g.matmul(W, b));  // 4, then 1
  g.matmul_into(W, c, out);
  g.matmul_into(W, c, out);  // the same output: not together
  const size_t range_end = g.n_nodes();
  const TensorId e = g.matmul(W, d), f = g.matmul(W, d);  // split by the range below
  (void)e;
  (void)f;
  std::vector<float> arena(g.plan() / sizeof(float) + 16);
  ProductCountingBackend be;
  g.execute(be, arena.data(), 0, range_end - 1);
  g.execute(be, arena.data(), range_end - 1, range_end + 1);
  g.execute(be, arena.data(), range_end + 1);
  EXPECT_EQ(be.runs, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(be.product_calls, 3 + 4 + 1);  // the accumulating one on its own

  std::vector<float> t1(rows * dim), t2(rows * dim), want(rows * dim);
  auto cpu = make_cpu_backend(1);
  cpu->matmul(W, x.data(), rows, t1.data());  // b's and c's too
  cpu->matmul(W, t1.data(), rows, want.data());
  EXPECT_TRUE(std::memcmp(y.data(), want.data(), want.size() * sizeof(float)) == 0);
}

TEST(Graph, AProductWithoutItsBuffersIsRefused) {
  auto cpu = make_cpu_backend(1);
  std::vector<float> w(4, 1.0f), x(2, 1.0f), y(2, 0.0f);
  const WeightView W{w.data(), DType::F32, 2, 2};
  ProductArgs a{.w = &W, .x = x.data(), .n_rows = 1, .accumulate = true, .y = y.data()};
  EXPECT_THROW(cpu->product(a), Error);  // no scratch to accumulate through
  a = {.w = &W, .x = x.data(), .gate = ProductArgs::Gate::kSilu, .n_rows = 1, .y = y.data()};
  EXPECT_THROW(cpu->product(a), Error);  // a gate without up
  Graph g;
  const TensorId t = g.external(x.data(), 1, 2);
  EXPECT_THROW(g.matmul_add_into(W, t, t), Error);  // the output is its input
}

}  // namespace
}  // namespace cb
