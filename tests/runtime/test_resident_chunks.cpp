// Chunk KV kept in backend memory between requests (runtime/resident_chunks.h):
// the byte budget and its eviction order, one recording at a time, what a
// session gives it by default, and RAG requests that copy their chunks from
// it with the bits of reading them from the store.
#include <gtest/gtest.h>

#include "cache/chunk_store.h"
#include "platform/error.h"
#include "runtime/blend/rag_request.h"
#include "runtime/resident_chunks.h"
#include "tests/runtime/counting_backends.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

// A CPU backend whose alloc_buffer can be made to find no memory.
class ScarceBackend final : public test::CountingBackend {
 public:
  void* alloc_buffer(size_t bytes) override {
    if (out_of_memory) fail(ErrorCode::kOutOfMemory, "no memory left (injected)");
    ++allocs;
    return CountingBackend::alloc_buffer(bytes);
  }
  bool out_of_memory = false;
  int allocs = 0;
};

// Entries of 2 layers x 4-wide rows, f16 V: 16 + 8 bytes a token and layer,
// each layer rounded up to 64 bytes.
constexpr int64_t kLayers = 2, kKvDim = 4;
constexpr uint64_t kEntry = 2 * 192;  // 6 tokens: 6 * 24 = 144 bytes, 192 a layer

TEST(ResidentChunks, EvictsTheLeastRecentlyUsedNeverTheRequestsOwn) {
  ScarceBackend be;
  ResidentChunks r(be, kLayers, kKvDim, 2, 3 * kEntry);
  r.begin_request();
  ResidentChunk* a = r.acquire("a", 6);
  ResidentChunk* b = r.acquire("b", 6);
  ResidentChunk* c = r.acquire("c", 6);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(r.bytes(), 3 * kEntry);
  EXPECT_EQ(static_cast<char*>(a->v(0)) - reinterpret_cast<char*>(a->k(0)), 6 * 4 * 4);
  EXPECT_EQ(reinterpret_cast<char*>(a->k(1)) - reinterpret_cast<char*>(a->k(0)), 192);
  // Full, and every entry is this request's: no room for a fourth.
  EXPECT_EQ(r.acquire("d", 6), nullptr);
  for (ResidentChunk* e : {a, b, c}) e->ready = true;
  r.begin_request();
  EXPECT_EQ(r.acquire("b", 6), b);  // used again: now the most recent
  r.begin_request();
  EXPECT_EQ(r.acquire("c", 6), c);
  ResidentChunk* d = r.acquire("d", 6);  // evicts a, the oldest
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->ready);
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(r.acquire("a", 6)->ready, false);  // gone: recorded anew, evicting b
  EXPECT_EQ(r.acquire("c", 6), c);
  EXPECT_TRUE(c->ready);
  EXPECT_EQ(r.bytes(), 3 * kEntry);
  // Larger than the whole budget: never kept.
  EXPECT_EQ(r.acquire("huge", 100), nullptr);
  EXPECT_EQ(be.allocs, 5);
  r.clear();
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.bytes(), 0u);
}

TEST(ResidentChunks, OneRecordingAtATimeAndNamesTiedToTheirSize) {
  ScarceBackend be;
  ResidentChunks r(be, kLayers, kKvDim, 2, 4 * kEntry);
  r.begin_request();
  ResidentChunk* a = r.acquire("a", 6);
  ASSERT_NE(a, nullptr);
  // The same chunk twice in a request is recorded by its first reference.
  EXPECT_EQ(r.acquire("a", 6), nullptr);
  a->ready = true;
  EXPECT_EQ(r.acquire("a", 6), a);  // ready: any number may read it
  // A recording that never finished is recorded again by a later request.
  ResidentChunk* b = r.acquire("b", 6);
  r.begin_request();
  EXPECT_EQ(r.acquire("b", 6), b);
  EXPECT_FALSE(b->ready);
  // A name asked for with another size names other bytes: never while the
  // request holds the entry, else in place of it.
  EXPECT_EQ(r.acquire("a", 6), a);
  EXPECT_EQ(r.acquire("a", 4), nullptr);
  r.begin_request();
  ResidentChunk* a4 = r.acquire("a", 4);
  ASSERT_NE(a4, nullptr);
  EXPECT_FALSE(a4->ready);
  EXPECT_EQ(a4->n_tokens, 4);
  EXPECT_EQ(r.size(), 2u);
}

TEST(ResidentChunks, NoMemoryOrNoBudgetKeepsNothing) {
  ScarceBackend be;
  ResidentChunks none(be, kLayers, kKvDim, 2, 0);
  none.begin_request();
  EXPECT_EQ(none.acquire("a", 6), nullptr);
  ResidentChunks r(be, kLayers, kKvDim, 2, 4 * kEntry);
  r.begin_request();
  be.out_of_memory = true;
  EXPECT_EQ(r.acquire("a", 6), nullptr);
  EXPECT_EQ(r.size(), 0u);
  be.out_of_memory = false;
  EXPECT_NE(r.acquire("a", 6), nullptr);
  EXPECT_EQ(be.allocs, 1);
}

const Model& model() {
  return test::shared_model();
}

TEST(ResidentChunks, ASessionKeepsThemOnlyWhereLoadsAreStaged) {
  Session cpu(model(), {.n_ctx = 64, .n_threads = 2, .resident_kv_bytes = 1 << 20});
  EXPECT_EQ(cpu.resident_chunks().budget_bytes(), 0u);
  // A staging backend's own choice (the CPU's underneath: none), or what
  // the options say.
  Session staged_default(model(), {.n_ctx = 64}, std::make_unique<test::StagingBackend>());
  EXPECT_EQ(staged_default.resident_chunks().budget_bytes(), 0u);
  Session staged(model(), {.n_ctx = 64, .resident_kv_bytes = 1 << 20},
                 std::make_unique<test::StagingBackend>());
  EXPECT_EQ(staged.resident_chunks().budget_bytes(), 1u << 20);
  try {
    Session bad(model(), {.n_ctx = 64, .resident_kv_bytes = -2});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("resident_kv_bytes"), std::string::npos) << e.what();
  }
}

// The lighthouse request three times through one RAM store, on a session
// that stages its loads: computed, then read from the store (and recorded),
// then copied from backend memory; the last two with the same bits as a
// session that reads the store.  Another store of the same chunks names
// other bytes.
TEST(ResidentChunks, RagRequestsCopyStoredChunksWithTheStoresBits) {
  const RagPrompt prompt = test::lighthouse_prompt(model());
  const int64_t n_chunks = static_cast<int64_t>(prompt.chunks.size());
  RagPrefillOptions opts;
  for (const bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "serial");
    opts.pipeline.enabled = pipelined;
    cache::RamChunkStore store;
    Session plain(model(), {.n_ctx = 256, .n_threads = 2});
    Session staged(model(), {.n_ctx = 256, .n_threads = 2, .resident_kv_bytes = 64 << 20},
                   std::make_unique<test::StagingBackend>());
    auto request = [&](Session& s, cache::ChunkStore& st, RagPrefillStats& stats) {
      s.truncate(0);
      auto l = rag_prefill(s, prompt, &st, opts, &stats);
      return std::vector<float>(l.begin(), l.end());
    };
    RagPrefillStats st;
    request(staged, store, st);
    EXPECT_EQ(st.cache_misses, n_chunks);
    EXPECT_EQ(staged.resident_chunks().size(), 0u);  // computed chunks are not kept
    const std::vector<float> want = request(plain, store, st);
    EXPECT_EQ(st.cache_hits, n_chunks);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      EXPECT_EQ(request(staged, store, st), want);
      EXPECT_EQ(st.cache_hits, n_chunks);
      EXPECT_EQ(st.resident_hits, round == 0 ? 0 : n_chunks);
      EXPECT_EQ(st.fusion.bytes_read == 0, round == 1);
      EXPECT_EQ(staged.resident_chunks().size(), static_cast<size_t>(n_chunks));
    }
    cache::RamChunkStore other;
    request(plain, other, st);  // computes and keeps the chunks there
    EXPECT_EQ(request(staged, other, st), want);
    EXPECT_EQ(st.resident_hits, 0);
    EXPECT_EQ(staged.resident_chunks().size(), 2u * static_cast<size_t>(n_chunks));
  }
}

}  // namespace
}  // namespace cb
