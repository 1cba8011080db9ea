// Backend::product on CUDA with CB_CUDA_FUSED_GEMV: a product of few rows
// forms act(gate) * up as it loads its input and adds its outputs to y in
// one GEMV launch.  Each must give the bits of the ops it replaces
// (Backend::product's default, which a backend without the switch runs),
// on the f32 GEMV and on the int8 one, and where the GEMV does not take the
// weight or the rows the product falls back to those ops.  Products of one
// input in one launch (Backend::products) give the bits of their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "platform/error.h"
#include "tests/cuda/cuda_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

using test::Cuda;

// A managed-memory backend made with the given switches set (each read
// when a backend is made).
std::unique_ptr<Backend> make_backend(bool fused, bool int8) {
  if (fused) setenv("CB_CUDA_FUSED_GEMV", "1", 1);
  if (int8) setenv("CB_CUDA_INT8", "1", 1);
  CudaBackendOptions o;
  o.memory = CudaMemory::kManaged;
  auto be = make_cuda_backend(0, o);
  unsetenv("CB_CUDA_FUSED_GEMV");
  unsetenv("CB_CUDA_INT8");
  return be;
}

TEST_F(Cuda, FusedProductsGiveTheBitsOfTheirOps) {
  std::mt19937 rng(21);
  struct Shape {
    int64_t n_out, n_in;
  };
  // A Qwen2.5-1.5B layer's output and down projections, and shapes for
  // every launch shape of the GEMV (one, two and four weight rows a warp).
  const std::vector<Shape> shapes = {
      {1536, 1536}, {1536, 8960}, {37, 256}, {4099, 512}, {9000, 256}};
  using Gate = ProductArgs::Gate;
  for (bool int8 : {false, true}) {
    const auto fused = make_backend(true, int8), plain = make_backend(false, int8);
    // Q8_0: the int8 GEMV only; F32: neither (the ops one by one).
    for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F32}) {
      for (const Shape sh : shapes) {
        if (t == DType::F32 && sh.n_in * sh.n_out > 2'000'000) continue;
        const std::vector<uint8_t> data = test::random_weight(rng, t, sh.n_out, sh.n_in);
        const WeightView hw{data.data(), t, sh.n_in, sh.n_out};
        const WeightView wf = fused->prepare_weight(hw), wp = plain->prepare_weight(hw);
        // 9 rows: past the GEMV (the ops one by one on both).
        for (int64_t n_rows : {1, 3, 9}) {
          const int64_t n_x = n_rows * sh.n_in, n_y = n_rows * sh.n_out;
          const std::vector<float> x = test::random_floats(rng, n_x),
                                   up = test::random_floats(rng, n_x),
                                   y0 = test::random_floats(rng, n_y),
                                   bias = test::random_floats(rng, sh.n_out);
          float* dx = dev(x);
          float* dup = dev(up);
          float* scratch = dev(y0);
          float* y = dev(y0);
          for (Gate gate : {Gate::kNone, Gate::kSilu, Gate::kGeluTanh}) {
            for (bool accumulate : {false, true}) {
              for (bool q8 : {false, true}) {
                for (bool biased : {false, true}) {
                  if (gate == Gate::kNone && !accumulate) continue;  // a plain matmul
                  const std::string what =
                      std::string(dtype_name(t)) + " " + std::to_string(sh.n_out) + "x" +
                      std::to_string(sh.n_in) + " rows=" + std::to_string(n_rows) +
                      " gate=" + std::to_string(static_cast<int>(gate)) +
                      " accumulate=" + std::to_string(accumulate) + " q8=" + std::to_string(q8) +
                      " bias=" + std::to_string(biased) + " int8=" + std::to_string(int8);
                  auto run = [&](Backend& be, const WeightView& w) {
                    // The gate may have been overwritten: x afresh each run.
                    std::copy(x.begin(), x.end(), dx);
                    std::fill(scratch, scratch + n_y, NAN);
                    if (accumulate) {
                      std::copy(y0.begin(), y0.end(), y);
                    } else {
                      std::fill(y, y + n_y, NAN);
                    }
                    ProductArgs a;
                    a.w = &w;
                    a.x = dx;
                    a.up = gate == Gate::kNone ? nullptr : dup;
                    a.gate = gate;
                    a.n_rows = n_rows;
                    a.bias = biased ? bias.data() : nullptr;  // host memory, as a weight's
                    a.q8 = q8;
                    a.accumulate = accumulate;
                    a.scratch = scratch;
                    a.y = y;
                    be.product(a);
                    return host(y, static_cast<size_t>(n_y));
                  };
                  const std::vector<float> want = run(*plain, wp), got = run(*fused, wf);
                  ASSERT_TRUE(test::bitwise_equal(got, want)) << what;
                  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
                }
              }
            }
          }
        }
      }
    }
  }
}

// Inside a recorded batch (a decode token's graph) and replayed: the same
// bits each time, the same as issued.
TEST_F(Cuda, FusedProductsReplay) {
  std::mt19937 rng(22);
  const auto fused = make_backend(true, false);
  const int64_t n_in = 8960, n_out = 1536;
  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q6_K, n_out, n_in);
  const WeightView w = fused->prepare_weight({data.data(), DType::Q6_K, n_in, n_out});
  const std::vector<float> x = test::random_floats(rng, n_in), up = test::random_floats(rng, n_in),
                           y0 = test::random_floats(rng, n_out);
  float* dx = dev(x);
  const float* du = dev(up);
  float* y = dev(y0);
  float* scratch = dev(std::vector<float>(static_cast<size_t>(n_out)));
  const ProductArgs a{.w = &w,
                      .x = dx,
                      .up = du,
                      .gate = ProductArgs::Gate::kSilu,
                      .n_rows = 1,
                      .accumulate = true,
                      .scratch = scratch,
                      .y = y};
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    std::copy(x.begin(), x.end(), dx);
    std::copy(y0.begin(), y0.end(), y);
    if (fused->begin_replay(7) != Backend::ReplayStart::kReplayed) fused->product(a);
    fused->end_batch();
    const std::vector<float> got = host(y, static_cast<size_t>(n_out));
    if (run == 0) {
      first = got;
      std::copy(x.begin(), x.end(), dx);
      std::copy(y0.begin(), y0.end(), y);
      fused->product(a);  // issued, outside any batch
      EXPECT_TRUE(test::bitwise_equal(host(y, static_cast<size_t>(n_out)), first));
    }
    EXPECT_TRUE(test::bitwise_equal(got, first)) << "run " << run;
  }
  fused->forget_replay(7);
}

// Backend::products: consecutive products of one input in one launch where
// they share a weight type and launch shape (Q and K of a Q4_K_M layer, its
// gate and up), the rest one by one (V, when it is Q6_K; the int8 GEMV):
// every output the bits of the products run one by one.
TEST_F(Cuda, MergedProductsGiveTheBitsOfTheirOwnLaunches) {
  std::mt19937 rng(23);
  struct Part {
    DType type;
    int64_t n_out;
    bool bias;
  };
  const int64_t n_in = 1536;
  const std::vector<std::vector<Part>> groups = {
      {{DType::Q4_K, 1536, true}, {DType::Q4_K, 256, true}, {DType::Q6_K, 256, true}},
      {{DType::Q4_K, 1536, true}, {DType::Q4_K, 256, true}, {DType::Q4_K, 256, true}},
      {{DType::Q4_K, 8960, false}, {DType::Q4_K, 8960, false}},
      {{DType::Q6_K, 300, false}, {DType::Q6_K, 5000, false}},  // two launch shapes
  };
  for (bool int8 : {false, true}) {
    const auto fused = make_backend(true, int8), plain = make_backend(false, int8);
    for (const std::vector<Part>& group : groups) {
      std::vector<std::vector<uint8_t>> data;
      std::vector<WeightView> wf, wp;
      std::vector<std::vector<float>> biases;
      for (const Part& p : group) {
        data.push_back(test::random_weight(rng, p.type, p.n_out, n_in));
        const WeightView hw{data.back().data(), p.type, n_in, p.n_out};
        wf.push_back(fused->prepare_weight(hw));
        wp.push_back(plain->prepare_weight(hw));
        biases.push_back(test::random_floats(rng, p.n_out));
      }
      for (int64_t n_rows : {1, 3}) {
        for (bool q8 : {false, true}) {
          float* x = dev(test::random_floats(rng, n_rows * n_in));
          auto run = [&](Backend& be, const std::vector<WeightView>& ws) {
            std::vector<ProductArgs> args(group.size());
            std::vector<float*> ys;
            for (size_t i = 0; i < group.size(); ++i) {
              ys.push_back(
                  dev(std::vector<float>(static_cast<size_t>(n_rows * group[i].n_out), NAN)));
              args[i] = {.w = &ws[i],
                         .x = x,
                         .n_rows = n_rows,
                         .bias = group[i].bias ? biases[i].data() : nullptr,
                         .q8 = q8,
                         .y = ys.back()};
            }
            be.products(args.data(), static_cast<int64_t>(args.size()));
            std::vector<float> all;
            for (size_t i = 0; i < group.size(); ++i) {
              const std::vector<float> y =
                  host(ys[i], static_cast<size_t>(n_rows * group[i].n_out));
              all.insert(all.end(), y.begin(), y.end());
            }
            return all;
          };
          const std::vector<float> want = run(*plain, wp), got = run(*fused, wf);
          EXPECT_TRUE(test::bitwise_equal(got, want))
              << "group of " << group.size() << " (first " << dtype_name(group[0].type) << " "
              << group[0].n_out << ") rows=" << n_rows << " q8=" << q8 << " int8=" << int8;
        }
      }
    }
  }
}

TEST_F(Cuda, FusedGemvSwitchRefusesOtherValues) {
  setenv("CB_CUDA_FUSED_GEMV", "yes", 1);
  try {
    make_cuda_backend(0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CB_CUDA_FUSED_GEMV"), std::string::npos) << e.what();
  }
  unsetenv("CB_CUDA_FUSED_GEMV");
}

}  // namespace
}  // namespace cb
