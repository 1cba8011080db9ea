// The runtime's batches under the completion a GPU stream gives them, on the
// CPU: a backend that runs a batch's ops only when the batch ends
// (tests/runtime/deferring_backend.h).  Host code that read a result before
// its batch had ended would read stale numbers there, so prefill, decode, a
// chunk's precompute and every fusion policy must equal the CPU backend's
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "runtime/blend/fusor.h"
#include "tests/runtime/deferring_backend.h"
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

// A session on a DeferringBackend, which it owns; be stays valid while it lives.
struct DeferredSession {
  explicit DeferredSession(const SessionOptions& o) {
    auto owned = std::make_unique<test::DeferringBackend>();
    be = owned.get();
    s = std::make_unique<Session>(model(), o, std::move(owned));
  }
  test::DeferringBackend* be;
  std::unique_ptr<Session> s;
};

class DeferredBatchesTest : public testing::Test, public test::LighthouseRequest {
 protected:
  DeferredBatchesTest() : LighthouseRequest(model()) {}
};

TEST_F(DeferredBatchesTest, PrefillDecodeAndPrecomputeEqualTheCpu) {
  for (const KvType type : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv_type_name(type));
    const SessionOptions o{.n_ctx = 256, .n_threads = 2, .kv_type = type};
    Session cpu(model(), o);
    DeferredSession late(o);
    std::vector<int32_t> ids = prompt.head;
    ids.insert(ids.end(), prompt.chunks[0].begin(), prompt.chunks[0].end());
    EXPECT_EQ(copy(late.s->prefill(ids)), copy(cpu.prefill(ids)));
    for (int32_t t : {42, 7, 1000}) EXPECT_EQ(copy(late.s->decode(t)), copy(cpu.decode(t)));
    EXPECT_EQ(kv_rows(*late.s), kv_rows(cpu));
    late.s->truncate(0);
    cpu.truncate(0);
    const cache::ChunkKV got = precompute_chunk_kv(*late.s, prompt.head, prompt.chunks[1]);
    const cache::ChunkKV want = precompute_chunk_kv(cpu, prompt.head, prompt.chunks[1]);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.v, want.v);
    EXPECT_GT(late.be->deferred, 0);
  }
}

TEST_F(DeferredBatchesTest, EveryFusionEqualsTheCpu) {
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
        DeferredSession late(o);
        const auto got = copy(fuse_prefill(*late.s, segs, b, &got_st, p));
        EXPECT_EQ(got, want);
        EXPECT_EQ(got_st.final_rows, want_st.final_rows);
        EXPECT_EQ(kv_rows(*late.s), kv_rows(cpu));
        EXPECT_EQ(copy(late.s->decode(42)), copy(cpu.decode(42)));
        EXPECT_GT(late.be->deferred, 0);
      }
}

}  // namespace
}  // namespace cb
