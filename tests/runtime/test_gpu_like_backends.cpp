// The runtime on two test backends that behave, on the CPU, as a GPU's does:
// one completes a batch's ops only when the batch ends, as a stream does
// (tests/runtime/deferring_backend.h: host code that read a result before
// its batch ended would read stale numbers), and one whose buffers the host
// cannot touch, as device memory (tests/runtime/device_only_backend.h: a
// host access dies with SIGSEGV).  On each, prefill, decode, reading the KV
// cache, a chunk's precompute, every fusion policy and mode, RAG requests
// through a chunk store and from resident chunks, and embeddings must equal
// the CPU backend's bit for bit.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "cache/chunk_store.h"
#include "runtime/blend/fusor.h"
#include "runtime/blend/rag_request.h"
#include "tests/runtime/deferring_backend.h"
#include "tests/runtime/device_only_backend.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

// Every layer's K and V rows [0, n_past) as f32.
std::vector<float> kv_rows(Session& s) {
  const auto& hp = model().hparams();
  const int64_t n = s.n_past(), row = hp.kv_dim();
  std::vector<float> all, rows(static_cast<size_t>(n * row));
  for (int64_t layer = 0; layer < hp.n_layer; ++layer)
    for (bool v : {false, true}) {
      s.read_kv_rows(layer, v, 0, n, rows.data());
      all.insert(all.end(), rows.begin(), rows.end());
    }
  return all;
}

std::vector<float> copy(std::span<const float> l) {
  return {l.begin(), l.end()};
}

enum class Like { kStream, kDeviceMemory };

// A session on a backend of kind `like`, which it owns, and whether that
// backend's GPU-like behaviour was exercised (ops deferred, buffers opened).
struct LikeSession {
  LikeSession(Like like, const SessionOptions& o) {
    std::unique_ptr<Backend> be;
    if (like == Like::kStream) {
      auto d = std::make_unique<test::DeferringBackend>();
      exercised = [p = d.get()] { return p->deferred > 0; };
      be = std::move(d);
    } else {
      auto d = std::make_unique<test::DeviceOnlyBackend>();
      exercised = [p = d.get()] { return p->opened() > 0; };
      be = std::move(d);
    }
    s = std::make_unique<Session>(model(), o, std::move(be));
  }
  std::unique_ptr<Session> s;
  std::function<bool()> exercised;
};

class GpuLikeBackendTest : public testing::TestWithParam<Like>, public test::LighthouseRequest {
 protected:
  GpuLikeBackendTest() : LighthouseRequest(model()) {}
};

TEST_P(GpuLikeBackendTest, PrefillDecodeAndPrecomputeEqualTheCpu) {
  for (const KvType type : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv_type_name(type));
    const SessionOptions o{.n_ctx = 256, .n_threads = 2, .kv_type = type};
    Session cpu(model(), o);
    LikeSession like(GetParam(), o);
    Session& s = *like.s;
    std::vector<int32_t> ids = prompt.head;
    ids.insert(ids.end(), prompt.chunks[0].begin(), prompt.chunks[0].end());
    EXPECT_EQ(copy(s.prefill(ids)), copy(cpu.prefill(ids)));
    for (int32_t t : {42, 7, 1000}) EXPECT_EQ(copy(s.decode(t)), copy(cpu.decode(t)));
    EXPECT_EQ(kv_rows(s), kv_rows(cpu));
    s.truncate(0);
    cpu.truncate(0);
    const cache::ChunkKV got = precompute_chunk_kv(s, prompt.head, prompt.chunks[1]);
    const cache::ChunkKV want = precompute_chunk_kv(cpu, prompt.head, prompt.chunks[1]);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.v, want.v);
    EXPECT_TRUE(like.exercised());
  }
}

TEST_P(GpuLikeBackendTest, EveryFusionEqualsTheCpu) {
  const auto segs = segments();
  for (const KvType type : {KvType::kF16, KvType::kF32})
    for (const Selection sel : {Selection::kLookahead, Selection::kHkvd, Selection::kHkvdKv,
                                Selection::kAttention, Selection::kRandom})
      for (const bool pipelined : {true, false}) {
        SCOPED_TRACE(std::string(kv_type_name(type)) + ", " + selection_name(sel) +
                     (pipelined ? ", pipelined" : ", serial"));
        const SessionOptions o{.n_ctx = 256, .n_threads = 2, .kv_type = type};
        BlendOptions b;
        b.selection = sel;
        const PipelineOptions p{.enabled = pipelined};
        Session cpu(model(), o);
        FusionStats want_st, got_st;
        const auto want = copy(fuse_prefill(cpu, segs, b, &want_st, p));
        LikeSession like(GetParam(), o);
        const auto got = copy(fuse_prefill(*like.s, segs, b, &got_st, p));
        EXPECT_EQ(got, want);
        EXPECT_EQ(got_st.final_rows, want_st.final_rows);
        EXPECT_EQ(kv_rows(*like.s), kv_rows(cpu));
        EXPECT_EQ(copy(like.s->decode(42)), copy(cpu.decode(42)));
        EXPECT_TRUE(like.exercised());
      }
  for (const BlendMode mode : {BlendMode::kFull, BlendMode::kPrefix, BlendMode::kReuse}) {
    SCOPED_TRACE(blend_mode_name(mode));
    const SessionOptions o{.n_ctx = 256, .n_threads = 2};
    Session cpu(model(), o);
    LikeSession like(GetParam(), o);
    EXPECT_EQ(copy(fuse_prefill(*like.s, segs, {mode})), copy(fuse_prefill(cpu, segs, {mode})));
    EXPECT_EQ(kv_rows(*like.s), kv_rows(cpu));
  }
}

// The lighthouse request computed, then read from the store (and kept in
// backend memory), then copied within the backend; and a text's embedding.
TEST_P(GpuLikeBackendTest, RagRequestsAndEmbeddingsEqualTheCpu) {
  const int64_t n_chunks = static_cast<int64_t>(prompt.chunks.size());
  for (const bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "serial");
    RagPrefillOptions opts;
    opts.pipeline.enabled = pipelined;
    const SessionOptions o{.n_ctx = 256, .n_threads = 2, .resident_kv_bytes = 64 << 20};
    Session cpu(model(), o);
    LikeSession like(GetParam(), o);
    Session& s = *like.s;
    // Chunks kept in backend memory only where loads are staged.
    const bool resident = s.backend().wants_staged_uploads();
    auto request = [&](Session& on, cache::ChunkStore& store, RagPrefillStats& stats) {
      on.truncate(0);
      return copy(rag_prefill(on, prompt, &store, opts, &stats));
    };
    cache::RamChunkStore cpu_store, store;
    RagPrefillStats st;
    EXPECT_EQ(request(s, store, st), request(cpu, cpu_store, st));
    EXPECT_EQ(st.cache_misses, n_chunks);
    const std::vector<float> stored = request(cpu, cpu_store, st);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      EXPECT_EQ(request(s, store, st), stored);
      EXPECT_EQ(st.cache_hits, n_chunks);
      EXPECT_EQ(st.resident_hits, round == 1 && resident ? n_chunks : 0);
      EXPECT_EQ(kv_rows(s), kv_rows(cpu));
    }
    EXPECT_EQ(copy(s.decode(42)), copy(cpu.decode(42)));
    EXPECT_EQ(s.embed(prompt.chunks[0]), cpu.embed(prompt.chunks[0]));
    EXPECT_TRUE(like.exercised());
  }
}

INSTANTIATE_TEST_SUITE_P(, GpuLikeBackendTest, testing::Values(Like::kStream, Like::kDeviceMemory),
                         [](const testing::TestParamInfo<Like>& i) {
                           return i.param == Like::kStream ? "Stream" : "DeviceMemory";
                         });

}  // namespace
}  // namespace cb
