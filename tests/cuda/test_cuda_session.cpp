// The real model end to end on the CUDA backend, against the CPU backend:
// prefill logits, greedy decode, and a CacheBlend request (rag_prefill in
// blend mode over a RamChunkStore): its logits, the rows it selected for
// recomputation and the fused KV cache, with the layerwise pipeline on and
// off, and decoding after it.  The CPU path is pinned to a float64
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
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/chunk_store.h"
#include "kernels/cuda/cuda_backend.h"
#include "runtime/blend/rag_request.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

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

// Both sessions on the f32 path of decode and prefill: the rounded products
// (int8 activations on the CPU, f16 tensor cores on CUDA) differ from f32 by
// design, and comparing backends needs one arithmetic on both sides.
SessionOptions comparable_options(BackendKind b) {
  SessionOptions o;
  o.n_ctx = 512;
  o.backend = b;
  o.int8_decode = false;
  o.int8_prefill = false;
  return o;
}

class CudaSession : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: the CUDA session is compiled but not exercised here";
    if (!std::filesystem::exists(test::model_path()))
      GTEST_SKIP() << "model not found: " << test::model_path() << " (set CB_MODEL)";
  }
  static const Model& model() { return test::shared_model(); }
  static SessionOptions opts(BackendKind b) { return comparable_options(b); }
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

// Prefill, then greedy decode with each side feeding its own choice: the
// token streams must agree (a divergence is reported with the CPU's top-2
// gap, which tells a near-tie from a wrong result) and the logits within
// 1e-3.  An f32 cache: with the f16 one, K/V values that the two backends'
// sums leave an f32 ulp apart can round to f16 values an f16 ulp (2^-11)
// apart, and eight steps of that moved the real SmolLM2's logits by up to
// 1.4e-3 on an H200.  The blend tests below keep the f16 cache.  int8:
// decode's products take int8 activations on both sides (the CPU's default,
// CB_CUDA_INT8 on the GPU), the same bytes from the same activations.
void expect_greedy_decode_matches_cpu(const Model& model, const std::vector<int32_t>& p,
                                      bool int8) {
  ASSERT_GT(p.size(), 20u);
  SessionOptions o_cpu = comparable_options(BackendKind::kCpu),
                 o_gpu = comparable_options(BackendKind::kCuda);
  o_cpu.kv_type = o_gpu.kv_type = KvType::kF32;
  o_cpu.int8_decode = o_gpu.int8_decode = int8;
  Session cpu(model, o_cpu);
  if (int8) setenv("CB_CUDA_INT8", "1", 1);  // read when the session makes its backend
  Session gpu(model, o_gpu);
  if (int8) unsetenv("CB_CUDA_INT8");
  auto to_vec = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  std::vector<float> lc = to_vec(cpu.prefill(p));
  std::vector<float> lg = to_vec(gpu.prefill(p));
  const double e0 = test::rel_l2(lg, lc);
  std::printf("prefill (%zu tokens): rel L2 cuda vs cpu %.3g, top-2 gap %.3g\n", p.size(), e0,
              top2_gap(lc));
  EXPECT_LE(e0, 1e-3);
  ASSERT_EQ(argmax(lg), argmax(lc));
  constexpr int kSteps = 8;
  for (int step = 0; step < kSteps; ++step) {
    const int32_t tc = argmax(lc), tg = argmax(lg);
    ASSERT_EQ(tg, tc) << "greedy tokens differ at step " << step
                      << "; CPU top-2 gap: " << top2_gap(lc);
    lc = to_vec(cpu.decode(tc));
    lg = to_vec(gpu.decode(tg));
    const double e = test::rel_l2(lg, lc);
    std::printf("decode step %d (token %d%s): rel L2 %.3g\n", step, tc, int8 ? ", int8" : "", e);
    EXPECT_LE(e, 1e-3) << "step " << step;
  }
  EXPECT_EQ(gpu.n_past(), cpu.n_past());
}

TEST_F(CudaSession, PrefillAndGreedyDecodeMatchCpu) {
  expect_greedy_decode_matches_cpu(model(), prompt(), false);
}

TEST_F(CudaSession, Int8DecodeMatchesCpuInt8Decode) {
  expect_greedy_decode_matches_cpu(model(), prompt(), true);
}

// Decode tokens replayed from a CUDA graph (CudaBackendOptions::
// replay_batches) give the logits of the same tokens issued op by op,
// bitwise (the same kernels with the same arguments, none of them
// accumulating in a varying order): through the probe, the capture and
// the replays, after a longer prefill has moved the arena and after a
// context bias has changed the attention's arguments.
TEST_F(CudaSession, ReplayedDecodeEqualsIssuedDecode) {
  if (std::getenv("CB_CUDA_PROFILE") != nullptr || std::getenv("CB_CUDA_GRAPHS") != nullptr)
    GTEST_SKIP() << "CB_CUDA_PROFILE or CB_CUDA_GRAPHS decides for both backends here";
  CudaBackendOptions graphs, ops;
  graphs.replay_batches = true;
  ops.replay_batches = false;
  Session issued(model(), opts(BackendKind::kCuda), make_cuda_backend(0, ops));
  Session replayed(model(), opts(BackendKind::kCuda), make_cuda_backend(0, graphs));
  auto to_vec = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  const std::vector<int32_t> p = prompt();
  ASSERT_GE(p.size(), 26u);
  std::vector<float> want = to_vec(issued.prefill(std::span(p).first(6)));
  ASSERT_EQ(to_vec(replayed.prefill(std::span(p).first(6))), want);
  size_t next = 6;
  auto decode = [&](int n) {
    for (int i = 0; i < n; ++i, ++next) {
      want = to_vec(issued.decode(p[next]));
      ASSERT_EQ(to_vec(replayed.decode(p[next])), want) << "token " << next;
    }
  };
  decode(4);
  // The first token probes, the second is captured, the others replay.
  EXPECT_EQ(cuda_graph_launches(replayed.backend()), 3);
  EXPECT_EQ(cuda_graph_launches(issued.backend()), 0);
  want = to_vec(issued.prefill(std::span(p).subspan(next, 10)));
  ASSERT_EQ(to_vec(replayed.prefill(std::span(p).subspan(next, 10))), want);
  next += 10;
  decode(3);
  const KeyBlockBias bias{.key_begin = 2, .key_end = 12, .query_from = 0, .bias = -0.7f};
  issued.set_context_bias(bias);
  replayed.set_context_bias(bias);
  decode(3);
  EXPECT_EQ(cuda_graph_launches(replayed.backend()), 3 + 2 + 2);
}

// CacheBlend: the fusor reads and writes the KV cache from host code
// (chunk KV copied in, deviations computed on the host), so this covers the
// managed-memory path too.  Three runs: CPU computing its chunks, CUDA
// computing its own, and CUDA loading the chunks the CPU stored.
TEST_F(CudaSession, BlendRequestMatchesCpu) {
  const RagPrompt rp = test::lighthouse_prompt(model());
  RagPrefillOptions ro;
  ro.blend.mode = BlendMode::kBlend;
  auto run = [&](BackendKind b, cache::RamChunkStore& table, RagPrefillStats& st) {
    Session s(model(), opts(b));
    auto l = rag_prefill(s, rp, &table, ro, &st);
    return std::vector<float>(l.begin(), l.end());
  };
  cache::RamChunkStore cpu_table, gpu_table;
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

// Chunks kept in GPU memory between requests (Session::resident_chunks(),
// on by default on a discrete GPU): a request that copies them within the
// device gives the bits of one that reads them from the store, pipelined
// and serial, and decoding after it too.
TEST_F(CudaSession, ResidentChunksGiveTheStoresBits) {
  const RagPrompt rp = test::lighthouse_prompt(model());
  for (const bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "serial");
    RagPrefillOptions ro;
    ro.pipeline.enabled = pipelined;
    cache::RamChunkStore table;
    Session s(model(), opts(BackendKind::kCuda));
    if (!s.backend().wants_staged_uploads() || s.resident_chunks().budget_bytes() == 0)
      GTEST_SKIP() << "a GPU that shares the host's memory keeps no resident chunks";
    std::vector<std::vector<float>> logits, decoded;
    std::vector<RagPrefillStats> st(4);
    for (RagPrefillStats& x : st) {
      s.truncate(0);
      auto l = rag_prefill(s, rp, &table, ro, &x);
      logits.emplace_back(l.begin(), l.end());
      auto d = s.decode(argmax(l));
      decoded.emplace_back(d.begin(), d.end());
    }
    EXPECT_EQ(st[0].cache_misses, 3);
    EXPECT_EQ(st[1].resident_hits, 0);  // read from the store, and recorded
    for (size_t i = 2; i < st.size(); ++i) {
      EXPECT_EQ(st[i].resident_hits, 3);
      EXPECT_EQ(st[i].fusion.bytes_read, 0u);
      EXPECT_GT(st[i].fusion.resident_bytes, 0u);
      EXPECT_EQ(logits[i], logits[1]);
      EXPECT_EQ(decoded[i], decoded[1]);
    }
    std::printf("resident chunks: fuse %.2f ms from the store, %.2f / %.2f ms from GPU memory\n",
                st[1].fusion.compute_ms, st[2].fusion.compute_ms, st[3].fusion.compute_ms);
  }
}

// A context scale (BlendOptions::context_scale: a logit bias on the reused
// chunks' keys for the question's rows) gives the CPU's logits on CUDA too,
// and changes them (else the bias would not be under test).
TEST_F(CudaSession, ContextScaleBlendMatchesCpu) {
  const RagPrompt rp = test::lighthouse_prompt(model());
  auto run = [&](BackendKind b, float context_scale) {
    RagPrefillOptions ro;
    ro.blend.mode = BlendMode::kBlend;
    ro.blend.context_scale = context_scale;
    cache::RamChunkStore table;
    Session s(model(), opts(b));
    auto l = rag_prefill(s, rp, &table, ro, nullptr);
    return std::vector<float>(l.begin(), l.end());
  };
  const std::vector<float> plain = run(BackendKind::kCpu, 1.0f);
  const std::vector<float> lc = run(BackendKind::kCpu, 0.6f);
  const std::vector<float> lg = run(BackendKind::kCuda, 0.6f);
  const double moved = test::rel_l2(lc, plain), e = test::rel_l2(lg, lc);
  std::printf("context scale 0.6: rel L2 cuda vs cpu %.3g; cpu against scale 1 %.3g\n", e, moved);
  EXPECT_GT(moved, 1e-3);
  // Far nearer the CPU's scaled logits than the unscaled ones are: a
  // backend that ignored the bias would be `moved` away.
  EXPECT_LE(e, std::min(1e-2, 0.1 * moved));
  EXPECT_EQ(argmax(lg), argmax(lc)) << "CPU top-2 gap " << top2_gap(lc);
}

// The fusion's inner results, not only its logits: the HKVD rows selected
// at the last check layer (FusionStats::final_rows, chosen on the GPU by
// top_k over deviations computed there) must be the CPU's, and the fused KV
// cache must match row for row.  Both sessions fuse the same stored chunks
// (the CPU computes and stores them, CUDA loads them), so only the fusion
// differs.  Pipeline on (a loader thread uploading and rotating chunk KV
// beside the compute batches) and off must agree; then greedy decoding from
// the fused cache, the same tokens fed to both sessions.
TEST_F(CudaSession, BlendSelectionAndFusedCacheMatchCpu) {
  const RagPrompt rp = test::lighthouse_prompt(model());
  const LlamaHparams& hp = model().hparams();
  auto to_vec = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  for (bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipeline on" : "pipeline off");
    RagPrefillOptions ro;
    ro.blend.mode = BlendMode::kBlend;
    ro.pipeline.enabled = pipelined;
    cache::RamChunkStore table;
    Session cpu(model(), opts(BackendKind::kCpu));
    Session gpu(model(), opts(BackendKind::kCuda));
    RagPrefillStats sc, sg;
    std::vector<float> lc = to_vec(rag_prefill(cpu, rp, &table, ro, &sc));
    std::vector<float> lg = to_vec(rag_prefill(gpu, rp, &table, ro, &sg));
    EXPECT_EQ(sc.cache_misses, 3);
    EXPECT_EQ(sg.cache_hits, 3);
    EXPECT_EQ(sg.fusion.pipelined, pipelined);
    const double el = test::rel_l2(lg, lc);
    EXPECT_LE(el, 1e-2);
    EXPECT_EQ(argmax(lg), argmax(lc)) << "CPU top-2 gap " << top2_gap(lc);

    EXPECT_EQ(sg.fusion.rows_per_layer, sc.fusion.rows_per_layer);
    const std::vector<int32_t>& rc = sc.fusion.final_rows;
    const std::vector<int32_t>& rg = sg.fusion.final_rows;
    std::vector<int32_t> only_cpu, only_gpu;
    std::set_difference(rc.begin(), rc.end(), rg.begin(), rg.end(), std::back_inserter(only_cpu));
    std::set_difference(rg.begin(), rg.end(), rc.begin(), rc.end(), std::back_inserter(only_gpu));
    EXPECT_EQ(rg, rc) << only_cpu.size() << " rows only on the CPU, " << only_gpu.size()
                      << " only on CUDA, of " << rc.size();

    ASSERT_EQ(gpu.n_past(), cpu.n_past());
    const size_t n = static_cast<size_t>(cpu.n_past() * hp.kv_dim());
    double worst_k = 0.0, worst_v = 0.0;
    std::vector<float> gk(n), gv(n), ck(n), cv(n);
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      gpu.read_kv_rows(l, false, 0, cpu.n_past(), gk.data());
      gpu.read_kv_rows(l, true, 0, cpu.n_past(), gv.data());
      cpu.read_kv_rows(l, false, 0, cpu.n_past(), ck.data());
      cpu.read_kv_rows(l, true, 0, cpu.n_past(), cv.data());
      const double ek = test::rel_l2(gk, ck);
      const double ev = test::rel_l2(gv, cv);
      EXPECT_LE(ek, 1e-2) << "K of layer " << l;
      EXPECT_LE(ev, 1e-2) << "V of layer " << l;
      worst_k = std::max(worst_k, ek);
      worst_v = std::max(worst_v, ev);
    }
    std::printf(
        "blend (%s): logits rel L2 %.3g; %zu rows recomputed at the last layer (%zu differ); "
        "fused KV worst layer rel L2 K %.3g V %.3g\n",
        pipelined ? "pipeline on" : "pipeline off", el, rc.size(),
        only_cpu.size() + only_gpu.size(), worst_k, worst_v);

    constexpr int kSteps = 6;
    for (int step = 0; step < kSteps; ++step) {
      const int32_t t = argmax(lc);
      lc = to_vec(cpu.decode(t));
      lg = to_vec(gpu.decode(t));
      const double e = test::rel_l2(lg, lc);
      std::printf("  decode after blend, step %d (token %d): rel L2 %.3g\n", step, t, e);
      EXPECT_LE(e, 1e-2) << "step " << step;
      EXPECT_EQ(argmax(lg), argmax(lc)) << "step " << step << "; CPU top-2 gap " << top2_gap(lc);
    }
  }
}

}  // namespace
}  // namespace cb
