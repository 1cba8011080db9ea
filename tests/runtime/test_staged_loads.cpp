// Staged KV loads (Backend::wants_staged_uploads, the discrete-GPU path) run
// on the CPU through a backend that completes its uploads as late as it may:
// the fusion must equal the direct loads bit for bit (logits, selected rows,
// KV cache), pipelined or serial, also when a chunk fails to load, and a
// staging allocation failure must surface as the error it is.
#include <gtest/gtest.h>

#include <algorithm>

#include "platform/error.h"
#include "runtime/blend/fusor.h"
#include "runtime/blend/rag_request.h"
#include "tests/runtime/counting_backends.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

using test::FailingSource;

// What a fusion leaves behind (stats.final_rows: the selected rows).
struct Fused {
  std::vector<float> logits;
  std::vector<float> kv;  // every layer's K and V rows [0, n)
  FusionStats stats;
};

constexpr SessionOptions kOpts{.n_ctx = 256, .n_threads = 2};

class StagedLoadsTest : public testing::Test, public test::LighthouseRequest {
 protected:
  StagedLoadsTest() : LighthouseRequest(model()) {}
  static Fused fuse(Session& s, std::span<const Segment> segs, const PipelineOptions& p,
                    const BlendOptions& o = {}) {
    Fused f;
    auto l = fuse_prefill(s, segs, o, &f.stats, p);
    f.logits.assign(l.begin(), l.end());
    const auto& hp = model().hparams();
    const int64_t row = hp.kv_dim(), n = s.n_past();
    std::vector<float> rows(static_cast<size_t>(n * row));
    for (int64_t layer = 0; layer < hp.n_layer; ++layer) {
      for (bool v : {false, true}) {
        s.read_kv_rows(layer, v, 0, n, rows.data());
        f.kv.insert(f.kv.end(), rows.begin(), rows.end());
      }
    }
    return f;
  }
};

// Serial; pipelined with no bound, bounded, and read by 2 and 3 threads
// (the request has 3 chunks: threads taking 2 + 1 and 1 + 1 + 1 of them).
const PipelineOptions kModes[] = {{.enabled = false},
                                  {},
                                  {.enabled = true, .max_layers_ahead = 1},
                                  {.enabled = true, .fetch_threads = 2},
                                  {.enabled = true, .max_layers_ahead = 1, .fetch_threads = 3}};

std::string mode_name(const PipelineOptions& p) {
  return !p.enabled ? "serial"
                    : "pipelined, ahead " + std::to_string(p.max_layers_ahead) + ", " +
                          std::to_string(p.fetch_threads) + " fetch threads";
}

// A session on a StagingBackend, which it owns; be stays valid while it lives.
struct StagedSession {
  explicit StagedSession(const SessionOptions& o = kOpts) {
    auto owned = std::make_unique<test::StagingBackend>();
    be = owned.get();
    s = std::make_unique<Session>(model(), o, std::move(owned));
  }
  test::StagingBackend* be;
  std::unique_ptr<Session> s;
};

TEST_F(StagedLoadsTest, StagedEqualsDirectBitwise) {
  const auto segs = segments();
  const auto& hp = model().hparams();
  const int64_t copies = 2 * hp.n_layer * static_cast<int64_t>(sources.size());
  int64_t cached_tokens = 0;
  for (const auto& c : prompt.chunks) cached_tokens += static_cast<int64_t>(c.size());
  for (const KvType kv : {KvType::kF16, KvType::kF32})
    for (const BlendOptions& o : {BlendOptions{}, BlendOptions{BlendMode::kReuse, {}}})
      for (const PipelineOptions& p : kModes) {
        SCOPED_TRACE(mode_name(p) + (o.mode == BlendMode::kReuse ? ", reuse" : ", blend") + ", " +
                     kv_type_name(kv) + " cache");
        SessionOptions so = kOpts;
        so.kv_type = kv;
        Session direct(model(), so);
        const Fused want = fuse(direct, segs, p, o);
        StagedSession staged(so);
        const Fused got = fuse(*staged.s, segs, p, o);
        EXPECT_EQ(got.logits, want.logits);
        EXPECT_EQ(got.stats.final_rows, want.stats.final_rows);
        EXPECT_EQ(got.kv, want.kv);
        EXPECT_EQ(got.stats.bytes_read, want.stats.bytes_read);
        // One K and one V copy per chunk and layer, each reported by a wait.
        EXPECT_EQ(staged.be->uploads, copies);
        EXPECT_NEAR(got.stats.upload_ms, test::StagingBackend::kMsPerCopy * copies, 1e-9);
        EXPECT_EQ(want.stats.upload_ms, 0.0);
        // K as f32 (rotated after the copy), V as the cache stores it: an
        // f16 cache's V crosses at half the bytes.
        const int64_t v_bytes = kv == KvType::kF16 ? 2 : 4;
        EXPECT_EQ(staged.be->uploaded_bytes,
                  hp.n_layer * cached_tokens * hp.kv_dim() * (4 + v_bytes));
        // Staging is allocated once per request and freed by its end.
        EXPECT_EQ(staged.be->staging_allocs, 1);
        EXPECT_EQ(staged.be->staging_frees, 1);
        EXPECT_EQ(staged.be->pending_copies(), 0u);
        // Decoding goes on from the same cache.
        const auto a = staged.s->decode(42);
        const auto b = direct.decode(42);
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
      }
}

// A chunk kept in backend memory: the first fusion records it (its source
// fetched and staged as before, then copied within the backend into its
// entry), later ones copy it from there and never read the source; every
// fusion equals direct loads bitwise.
TEST_F(StagedLoadsTest, ResidentChunksLoadWithinTheBackendBitwise) {
  const auto& hp = model().hparams();
  int64_t cached_tokens = 0;
  for (const auto& c : prompt.chunks) cached_tokens += static_cast<int64_t>(c.size());
  for (const KvType kv : {KvType::kF16, KvType::kF32})
    for (const PipelineOptions& p : kModes) {
      SCOPED_TRACE(mode_name(p) + ", " + kv_type_name(kv) + " cache");
      SessionOptions so = kOpts;
      so.kv_type = kv;
      Session direct(model(), so);
      const Fused want = fuse(direct, segments(), p);
      so.resident_kv_bytes = int64_t{64} << 20;
      StagedSession staged(so);
      ResidentChunks& resident = staged.s->resident_chunks();
      const int64_t element = kv == KvType::kF16 ? 4 + 2 : 4 + 4;
      const int64_t chunk_bytes = hp.n_layer * cached_tokens * hp.kv_dim() * element;
      // Round 2 takes only the middle chunk's entry: a copy from it between
      // two staged chunks must leave the first one's slot alone.
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE("request " + std::to_string(round));
        resident.begin_request();
        auto segs = segments();
        // Once recorded, the chunks' sources fail at their first layer: a
        // fetch would make the fusion compute them instead.
        std::vector<std::unique_ptr<FailingSource>> broken;
        for (size_t i = 0; i < prompt.chunks.size(); ++i) {
          if (round == 2 && i != 1) continue;
          Segment& seg = segs[i + 1];
          seg.resident = resident.acquire("chunk " + std::to_string(i),
                                          static_cast<int64_t>(seg.tokens.size()));
          ASSERT_NE(seg.resident, nullptr);
          EXPECT_EQ(seg.resident->ready, round > 0);
          if (round > 0) {
            broken.push_back(std::make_unique<FailingSource>(*sources[i], 0));
            seg.cached = broken.back().get();
          }
        }
        staged.s->truncate(0);
        staged.be->uploads = 0;
        staged.be->uploaded_bytes = 0;
        const Fused got = fuse(*staged.s, segs, p);
        EXPECT_EQ(got.logits, want.logits);
        EXPECT_EQ(got.stats.final_rows, want.stats.final_rows);
        EXPECT_EQ(got.kv, want.kv);
        EXPECT_EQ(got.stats.chunks_recomputed, 0);
        if (round == 0) {
          // Staged as without an entry, then copied into it: twice the bytes.
          EXPECT_EQ(got.stats.bytes_read, want.stats.bytes_read);
          EXPECT_EQ(got.stats.resident_bytes, 0u);
          EXPECT_EQ(staged.be->uploaded_bytes, 2 * chunk_bytes);
          for (size_t i = 0; i < prompt.chunks.size(); ++i)
            EXPECT_TRUE(segs[i + 1].resident->ready);
        } else if (round == 2) {
          const uint64_t middle = static_cast<uint64_t>(hp.n_layer) * prompt.chunks[1].size() *
                                  static_cast<uint64_t>(hp.kv_dim() * element);
          EXPECT_EQ(got.stats.resident_bytes, middle);
          EXPECT_EQ(staged.be->uploaded_bytes, chunk_bytes);
        } else {
          EXPECT_EQ(got.stats.bytes_read, 0u);
          EXPECT_EQ(got.stats.resident_bytes, static_cast<uint64_t>(chunk_bytes));
          EXPECT_EQ(staged.be->uploaded_bytes, chunk_bytes);
        }
        EXPECT_EQ(staged.be->pending_copies(), 0u);
      }
      EXPECT_EQ(resident.size(), prompt.chunks.size());
    }
}

// A recording that did not finish (the request failed at a chunk, then
// restarted without it) leaves that chunk's entry unready, and the next
// request records it again.
TEST_F(StagedLoadsTest, AnUnfinishedRecordingIsNotUsed) {
  SessionOptions so = kOpts;
  so.resident_kv_bytes = int64_t{64} << 20;
  StagedSession staged(so);
  ResidentChunks& resident = staged.s->resident_chunks();
  Session direct(model(), kOpts);
  const Fused want = fuse(direct, segments(), {});
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("request " + std::to_string(round));
    resident.begin_request();
    auto segs = segments();
    FailingSource broken(*sources[1], 5);
    if (round == 0) segs[2].cached = &broken;
    for (size_t i = 0; i < prompt.chunks.size(); ++i)
      segs[i + 1].resident = resident.acquire("chunk " + std::to_string(i),
                                              static_cast<int64_t>(segs[i + 1].tokens.size()));
    staged.s->truncate(0);
    const Fused got = fuse(*staged.s, segs, {});
    if (round == 0) {
      EXPECT_EQ(got.stats.chunks_recomputed, 1);
      EXPECT_TRUE(segs[1].resident->ready);
      EXPECT_FALSE(segs[2].resident->ready);
      EXPECT_TRUE(segs[3].resident->ready);
    } else {
      EXPECT_EQ(got.stats.chunks_recomputed, 0);
      EXPECT_EQ(got.logits, want.logits);
      EXPECT_EQ(got.kv, want.kv);
      // Two chunks copied from their entries, one fetched and recorded.
      uint64_t second_chunk = 0;
      for (int64_t l = 0; l < model().hparams().n_layer; ++l)
        second_chunk += sources[1]->layer_bytes(l);
      EXPECT_EQ(got.stats.bytes_read, second_chunk);
      EXPECT_TRUE(segs[2].resident->ready);
    }
  }
}

TEST_F(StagedLoadsTest, DirectLoadsNeverStage) {
  auto owned = std::make_unique<test::CountingBackend>();
  test::CountingBackend& be = *owned;
  Session s(model(), kOpts, std::move(owned));
  for (const PipelineOptions& p : kModes) {
    s.truncate(0);
    fuse(s, segments(), p);
  }
  EXPECT_EQ(be.uploads, 0);
  EXPECT_EQ(be.staging_allocs, 0);
}

TEST_F(StagedLoadsTest, AChunkFailingToLoadIsComputedAlike) {
  auto segs = segments();
  for (int64_t fail_at : {int64_t{0}, int64_t{5}, model().hparams().n_layer - 1})
    for (const PipelineOptions& p : kModes) {
      SCOPED_TRACE(mode_name(p) + ", fail at " + std::to_string(fail_at));
      FailingSource broken(*sources[1], fail_at);
      segs[2].cached = &broken;
      Session direct(model(), kOpts);
      const Fused want = fuse(direct, segs, p);
      StagedSession staged;
      const Fused got = fuse(*staged.s, segs, p);
      EXPECT_EQ(got.stats.chunks_recomputed, 1);
      EXPECT_EQ(got.logits, want.logits);
      EXPECT_EQ(got.stats.final_rows, want.stats.final_rows);
      EXPECT_EQ(got.kv, want.kv);
      // The failed attempt's staging is freed, with no copy left reading it.
      EXPECT_EQ(staged.be->staging_allocs, 2);
      EXPECT_EQ(staged.be->staging_frees, 2);
      EXPECT_EQ(staged.be->pending_copies(), 0u);
    }
}

TEST_F(StagedLoadsTest, StagingAllocationFailureIsReported) {
  const auto segs = segments();
  for (const PipelineOptions& p : kModes) {
    StagedSession staged;
    staged.be->fail_staging = true;
    try {
      fuse(*staged.s, segs, p);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
    }
    // The session is still usable.
    staged.be->fail_staging = false;
    EXPECT_EQ(staged.s->n_past(), 0);
    EXPECT_NO_THROW(fuse(*staged.s, segs, p));
  }
}

}  // namespace
}  // namespace cb
