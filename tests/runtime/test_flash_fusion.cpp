// Fusion with chunk KV kept in the flash store (cache/): misses are computed
// and written back, hits are read layer by layer, and a damaged blob is a
// miss that is recomputed -- never a wrong answer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "cache/flash_chunk_store.h"
#include "runtime/blend/rag_request.h"
#include "runtime/sampler.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

namespace fs = std::filesystem;

const Model& model() {
  return test::shared_model();
}

using test::rel_l2;

class FlashFusion : public testing::Test {
 protected:
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("flash_fusion_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    std::vector<std::string> chunks = {
        "The lighthouse on Kell Island was built in 1862 by the engineer Mara Voss.",
        "Mara Voss was born in the harbour town of Pellwick and trained in Glasgow."};
    prompt =
        build_rag_prompt(model().tokenizer(), ChatFormat::kChatML, "Answer from the documents.",
                         chunks, "Where was the builder of the Kell Island lighthouse born?");
  }
  void TearDown() override { fs::remove_all(dir); }

  std::vector<float> run(cache::ChunkStore& store, RagPrefillStats* st) {
    Session s(model(), {.n_ctx = 256, .n_threads = 2, .int8_prefill = false});
    const RagPrefillOptions opts;  // blend, lookahead [(0, 0.2)], chunk head = prompt
    auto l = rag_prefill(s, prompt, &store, opts, st);
    return {l.begin(), l.end()};
  }

  fs::path dir;
  RagPrompt prompt;
};

TEST_F(FlashFusion, MissesAreWrittenBackAndServedFromFlash) {
  cache::RamChunkStore ram;
  RagPrefillStats ram_stats;
  auto want = run(ram, &ram_stats);

  for (cache::Codec codec : {cache::Codec::kF16, cache::Codec::kQ8}) {
    fs::remove_all(dir);
    auto store = std::shared_ptr<cache::FlashStore>(
        cache::FlashStore::open(dir.string(), {.codec = codec}).release());
    cache::FlashChunkStore flash(store);
    RagPrefillStats first, second;
    auto a = run(flash, &first);
    EXPECT_EQ(first.cache_misses, 2);
    EXPECT_LE(rel_l2(a, want), 1e-6);  // computed KV is used as is
    store->flush();
    auto b = run(flash, &second);
    EXPECT_EQ(second.cache_hits, 2);
    EXPECT_EQ(second.cache_misses, 0);
    // The codec's rounding is the only difference from the in-RAM KV.
    const double bound = codec == cache::Codec::kF16 ? 2e-3 : 5e-2;
    EXPECT_LE(rel_l2(b, want), bound) << cache::codec_name(codec);
    EXPECT_EQ(argmax(b), argmax(want)) << cache::codec_name(codec);
  }
}

TEST_F(FlashFusion, DamagedBlobIsRecomputedNotTrusted) {
  auto store = std::shared_ptr<cache::FlashStore>(
      cache::FlashStore::open(dir.string(), {.codec = cache::Codec::kF16}).release());
  cache::FlashChunkStore flash(store);
  RagPrefillStats st;
  run(flash, &st);
  store->flush();
  // Flip bytes in the middle of every blob: every layer segment after the
  // first damaged one fails its checksum.
  int damaged = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".kv") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(e.path()) / 2));
    f.write("\xde\xad\xbe\xef", 4);
    ++damaged;
  }
  ASSERT_EQ(damaged, 2);
  RagPrefillStats after;
  auto got = run(flash, &after);
  // Found in the index but unreadable, so computed: misses, not hits.
  EXPECT_EQ(after.fusion.chunks_recomputed, 2);
  EXPECT_EQ(after.cache_hits, 0);
  EXPECT_EQ(after.cache_misses, 2);
  // With both chunks computed, nothing is reused: the result is full prefill.
  Session full(model(), {.n_ctx = 256, .n_threads = 2, .int8_prefill = false});
  EXPECT_LE(rel_l2(got, full.prefill(prompt.tokens())), 1e-4);
  EXPECT_GE(store->stats().corrupt_drops, 2u);
}

// The chunk head is named by its token ids in full: heads that a 64-bit hash
// might confuse still give different keys.
TEST(ChunkCacheKey, NamesTheHeadByItsTokens) {
  const std::vector<int32_t> chunk = {5, 6, 7}, head_a = {1, 2, 3}, head_b = {1, 2, 4};
  const cache::ChunkKey a = chunk_cache_key(model(), ChunkHead::kPrompt, head_a, chunk, "");
  const cache::ChunkKey b = chunk_cache_key(model(), ChunkHead::kPrompt, head_b, chunk, "");
  EXPECT_NE(a.chunk_head, b.chunk_head);
  EXPECT_EQ(a.chunk_head,
            chunk_cache_key(model(), ChunkHead::kPrompt, head_a, chunk, "").chunk_head);
  EXPECT_EQ(a.chunk_head.size(), std::string("prompt:").size() + head_a.size() * sizeof(int32_t));
  EXPECT_NE(chunk_cache_key(model(), ChunkHead::kNone, {}, chunk, "").chunk_head, a.chunk_head);
}

}  // namespace
}  // namespace cb
