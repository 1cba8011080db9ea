// The runtime on a backend whose buffers the host cannot touch
// (tests/runtime/device_only_backend.h), as a discrete GPU's device memory:
// prefill, decode, reading the KV cache, a chunk's precompute and every
// fusion policy and mode must run there without a host access to backend memory
// (one would die with SIGSEGV) and equal the CPU backend's bit for bit.
#include <gtest/gtest.h>

#include <memory>

#include "cache/chunk_store.h"
#include "runtime/blend/fusor.h"
#include "runtime/blend/rag_request.h"
#include "tests/runtime/device_only_backend.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

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

struct DeviceOnlySession {
  explicit DeviceOnlySession(const SessionOptions& o) {
    auto owned = std::make_unique<test::DeviceOnlyBackend>();
    be = owned.get();
    s = std::make_unique<Session>(model(), o, std::move(owned));
  }
  test::DeviceOnlyBackend* be;
  std::unique_ptr<Session> s;
};

class DeviceOnlyMemoryTest : public testing::Test, public test::LighthouseRequest {
 protected:
  DeviceOnlyMemoryTest() : LighthouseRequest(model()) {}
};

TEST_F(DeviceOnlyMemoryTest, PrefillDecodeAndPrecomputeEqualTheCpu) {
  for (const KvType type : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv_type_name(type));
    const SessionOptions o{.n_ctx = 256, .n_threads = 2, .kv_type = type};
    Session cpu(model(), o);
    DeviceOnlySession dev(o);
    std::vector<int32_t> ids = prompt.head;
    ids.insert(ids.end(), prompt.chunks[0].begin(), prompt.chunks[0].end());
    EXPECT_EQ(copy(dev.s->prefill(ids)), copy(cpu.prefill(ids)));
    for (int32_t t : {42, 7, 1000}) EXPECT_EQ(copy(dev.s->decode(t)), copy(cpu.decode(t)));
    EXPECT_EQ(kv_rows(*dev.s), kv_rows(cpu));
    dev.s->truncate(0);
    cpu.truncate(0);
    const cache::ChunkKV got = precompute_chunk_kv(*dev.s, prompt.head, prompt.chunks[1]);
    const cache::ChunkKV want = precompute_chunk_kv(cpu, prompt.head, prompt.chunks[1]);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.v, want.v);
    EXPECT_GT(dev.be->opened(), 0);
  }
}

// The session's default f16 cache (the deferred-batches test covers f32).
TEST_F(DeviceOnlyMemoryTest, EveryFusionEqualsTheCpu) {
  const auto segs = segments();
  const SessionOptions o{.n_ctx = 256, .n_threads = 2};
  for (const Selection sel : {Selection::kLookahead, Selection::kHkvd, Selection::kHkvdKv,
                              Selection::kAttention, Selection::kRandom})
    for (const bool pipelined : {true, false}) {
      SCOPED_TRACE(std::string(selection_name(sel)) + (pipelined ? ", pipelined" : ", serial"));
      BlendOptions b;
      b.selection = sel;
      const PipelineOptions p{.enabled = pipelined};
      Session cpu(model(), o);
      FusionStats want_st, got_st;
      const auto want = copy(fuse_prefill(cpu, segs, b, &want_st, p));
      DeviceOnlySession dev(o);
      const auto got = copy(fuse_prefill(*dev.s, segs, b, &got_st, p));
      EXPECT_EQ(got, want);
      EXPECT_EQ(got_st.final_rows, want_st.final_rows);
      EXPECT_EQ(kv_rows(*dev.s), kv_rows(cpu));
      EXPECT_EQ(copy(dev.s->decode(42)), copy(cpu.decode(42)));
    }
  for (const BlendMode mode : {BlendMode::kFull, BlendMode::kPrefix, BlendMode::kReuse}) {
    SCOPED_TRACE(blend_mode_name(mode));
    Session cpu(model(), o);
    DeviceOnlySession dev(o);
    EXPECT_EQ(copy(fuse_prefill(*dev.s, segs, {mode})), copy(fuse_prefill(cpu, segs, {mode})));
    EXPECT_EQ(kv_rows(*dev.s), kv_rows(cpu));
  }
}

// Through a chunk store, and from chunks kept in backend memory: the
// lighthouse request computed, read from the store (and kept), then copied
// within the backend; and a text's embedding.
TEST_F(DeviceOnlyMemoryTest, RagRequestsAndEmbeddingsEqualTheCpu) {
  const int64_t n_chunks = static_cast<int64_t>(prompt.chunks.size());
  for (const bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "serial");
    RagPrefillOptions opts;
    opts.pipeline.enabled = pipelined;
    Session cpu(model(), {.n_ctx = 256, .n_threads = 2});
    DeviceOnlySession dev({.n_ctx = 256, .n_threads = 2, .resident_kv_bytes = 64 << 20});
    auto request = [&](Session& s, cache::ChunkStore& store, RagPrefillStats& stats) {
      s.truncate(0);
      return copy(rag_prefill(s, prompt, &store, opts, &stats));
    };
    cache::RamChunkStore cpu_store, dev_store;
    RagPrefillStats st;
    EXPECT_EQ(request(*dev.s, dev_store, st), request(cpu, cpu_store, st));
    EXPECT_EQ(st.cache_misses, n_chunks);
    const std::vector<float> stored = request(cpu, cpu_store, st);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      EXPECT_EQ(request(*dev.s, dev_store, st), stored);
      EXPECT_EQ(st.cache_hits, n_chunks);
      EXPECT_EQ(st.resident_hits, round == 0 ? 0 : n_chunks);
      EXPECT_EQ(kv_rows(*dev.s), kv_rows(cpu));
    }
    EXPECT_EQ(copy(dev.s->decode(42)), copy(cpu.decode(42)));
    EXPECT_EQ(dev.s->embed(prompt.chunks[0]), cpu.embed(prompt.chunks[0]));
  }
}

}  // namespace
}  // namespace cb
