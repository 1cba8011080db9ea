// The real model end to end on the CUDA backend, against the CPU backend:
// prefill logits, greedy decode, and a CacheBlend request (rag_prefill in
// blend mode over a MemoryChunkTable).  The CPU path is pinned to a float64
// oracle at 1e-3 relative L2 (tests/integration), so the same bar here says
// the GPU computes the same model.
//
// Skips without a CUDA device or without the model (CB_MODEL, else the
// default path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/blend/chunk_table.h"
#include "runtime/blend/rag_request.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The gap between the largest and second-largest logit: a greedy choice
// with a gap this small may differ between two correct f32 computations.
float top2_gap(std::span<const float> v) {
  std::vector<float> c(v.begin(), v.end());
  std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
  return c[0] - c[1];
}

class CudaSession : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count_or_zero() == 0)
      GTEST_SKIP() << "no CUDA device: the CUDA session is compiled but not exercised here";
    if (!std::filesystem::exists(test::model_path()))
      GTEST_SKIP() << "model not found: " << test::model_path() << " (set CB_MODEL)";
  }
  static const Model& model() { return test::shared_model(); }
  // Both sessions on decode's f32 path: the int8-activation path differs
  // from f32 by ~2.5e-2 by design, and comparing backends needs one
  // arithmetic on both sides.
  static SessionOptions opts(BackendKind b) {
    SessionOptions o;
    o.n_ctx = 512;
    o.backend = b;
    o.int8_decode = false;
    return o;
  }
  std::vector<int32_t> prompt() const {
    return model().tokenizer().encode(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is "
        "the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        false, true);
  }
};

TEST_F(CudaSession, BackendIsCuda) {
  Session s(model(), opts(BackendKind::kCuda));
  EXPECT_STREQ(s.backend().name(), "cuda");
}

TEST_F(CudaSession, PrefillAndGreedyDecodeMatchCpu) {
  const std::vector<int32_t> p = prompt();
  ASSERT_GT(p.size(), 20u);
  Session cpu(model(), opts(BackendKind::kCpu));
  Session gpu(model(), opts(BackendKind::kCuda));
  auto to_vec = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  std::vector<float> lc = to_vec(cpu.prefill(p));
  std::vector<float> lg = to_vec(gpu.prefill(p));
  const double e0 = test::rel_l2(lg, lc);
  std::printf("prefill (%zu tokens): rel L2 cuda vs cpu %.3g, top-2 gap %.3g\n", p.size(), e0,
              top2_gap(lc));
  EXPECT_LE(e0, 1e-3);
  ASSERT_EQ(argmax(lg), argmax(lc));

  // Greedy decode, each side feeding its own choice: the token streams must
  // agree (a divergence is reported with the CPU's top-2 gap, which tells a
  // near-tie from a wrong result).
  constexpr int kSteps = 8;
  for (int step = 0; step < kSteps; ++step) {
    const int32_t tc = argmax(lc), tg = argmax(lg);
    ASSERT_EQ(tg, tc) << "greedy tokens differ at step " << step
                      << "; CPU top-2 gap: " << top2_gap(lc);
    lc = to_vec(cpu.decode(tc));
    lg = to_vec(gpu.decode(tg));
    const double e = test::rel_l2(lg, lc);
    std::printf("decode step %d (token %d): rel L2 %.3g\n", step, tc, e);
    EXPECT_LE(e, 1e-3) << "step " << step;
  }
  EXPECT_EQ(gpu.n_past(), cpu.n_past());
}

// CacheBlend: the fusor reads and writes the KV cache from host code
// (chunk KV copied in, deviations computed on the host), so this covers the
// managed-memory path too.  Three runs: CPU computing its chunks, CUDA
// computing its own, and CUDA loading the chunks the CPU stored.
TEST_F(CudaSession, BlendRequestMatchesCpu) {
  const std::vector<std::string> texts = {
      "The lighthouse on Kell Island was built in 1862 by the engineer Mara Voss.",
      "Mara Voss was born in the harbour town of Pellwick and trained in Glasgow.",
      "Pellwick lies on the northern coast and is known for its herring fleet."};
  const RagPrompt rp =
      build_rag_prompt(model().tokenizer(), "Answer from the documents.", texts,
                       "Where was the builder of the Kell Island lighthouse born?");
  RagPrefillOptions ro;
  ro.blend.mode = BlendMode::kBlend;
  auto run = [&](BackendKind b, MemoryChunkTable& table, RagPrefillStats& st) {
    Session s(model(), opts(b));
    auto l = rag_prefill(s, rp, &table, ro, &st);
    return std::vector<float>(l.begin(), l.end());
  };
  MemoryChunkTable cpu_table, gpu_table;
  RagPrefillStats sc, sg, sx;
  const std::vector<float> lc = run(BackendKind::kCpu, cpu_table, sc);
  const std::vector<float> lg = run(BackendKind::kCuda, gpu_table, sg);
  const std::vector<float> lx = run(BackendKind::kCuda, cpu_table, sx);
  EXPECT_EQ(sc.cache_misses, 3);
  EXPECT_EQ(sg.cache_misses, 3);
  EXPECT_EQ(sx.cache_hits, 3);
  EXPECT_EQ(sx.cache_misses, 0);
  const double eg = test::rel_l2(lg, lc), ex = test::rel_l2(lx, lc);
  std::printf("blend: rel L2 cuda vs cpu %.3g (own chunks), %.3g (cpu's chunks); top-2 gap %.3g\n",
              eg, ex, top2_gap(lc));
  // The blend selects the tokens to recompute by the size of their KV
  // deviation, a ranking that rounding can reorder at the margin; 1e-2 still
  // catches any wrong layer or stale KV row (those give 1e-1 and up).
  EXPECT_LE(eg, 1e-2);
  EXPECT_LE(ex, 1e-2);
  EXPECT_EQ(argmax(lg), argmax(lc));
  EXPECT_EQ(argmax(lx), argmax(lc));
}

}  // namespace
}  // namespace cb
