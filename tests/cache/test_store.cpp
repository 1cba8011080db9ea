// FlashStore basics: round trips per codec, key separation (namespace, every
// key field, forced hash collisions), handles and stats.
#include "cache/flash_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>

#include "cache_test_util.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

using namespace testing;

TEST(FlashStore, F16RoundTripIsExactF16Rounding) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKV kv = make_kv(small_shape(), 1);
  const ChunkKey key = make_key(make_tokens(40, 1), Codec::kF16);
  EXPECT_EQ(store->put(key, kv.view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->shape(), kv.shape);
  EXPECT_EQ(h->codec(), Codec::kF16);
  auto got = fetch_all(*store, *h);
  ASSERT_TRUE(got);
  EXPECT_TRUE(equals_f16_of(*got, kv));
}

TEST(FlashStore, LossyCodecsRoundTripWithinTheirBound) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const KvShape s = small_shape();
  const ChunkKV kv = make_kv(s, 2);
  for (Codec c : {Codec::kQ8, Codec::kQ4}) {
    const ChunkKey key = make_key(make_tokens(40, 2), c);
    ASSERT_EQ(store->put(key, kv.view()), PutResult::kStored);
    auto h = store->lookup(key);
    ASSERT_TRUE(h);
    auto got = fetch_all(*store, *h);
    ASSERT_TRUE(got);
    // Whole-chunk check of the bound's scale: the per-group bounds are
    // checked exactly in codec_test; here the store must not mix up layers.
    for (int l = 0; l < s.n_layers; ++l) {
      double amax = 0, err = 0;
      for (int64_t i = 0; i < s.layer_floats(); ++i) {
        const int64_t at = l * s.layer_floats() + i;
        amax = std::max(amax, std::fabs(double{kv.k[at]}));
        err = std::max(err, std::fabs(double{got->k[at]} - kv.k[at]));
        err = std::max(err, std::fabs(double{got->v[at]} - kv.v[at]));
      }
      EXPECT_LE(err, amax * (c == Codec::kQ8 ? 1.0 / 100 : 1.0 / 12)) << codec_name(c);
      EXPECT_GT(err, 0.0) << "lossy codec returned exact data; layers mixed up?";
    }
  }
}

TEST(FlashStore, KeyWithoutCodecUsesTheStoreDefault) {
  TempDir dir;
  StoreOptions opt;
  opt.codec = Codec::kQ4;
  auto store = FlashStore::open(dir.path(), opt);
  ChunkKey key = make_key(make_tokens(40, 3));
  key.codec.reset();
  ASSERT_EQ(store->put(key, make_kv(small_shape(), 3).view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->codec(), Codec::kQ4);
  key.codec = Codec::kQ4;
  EXPECT_TRUE(store->lookup(key));
  key.codec = Codec::kQ8;
  EXPECT_FALSE(store->lookup(key));
}

TEST(FlashStore, NamespacesAreIsolated) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const auto tokens = make_tokens(40, 4);
  const ChunkKV a = make_kv(small_shape(), 41), b = make_kv(small_shape(), 42);
  ASSERT_EQ(store->put(make_key(tokens, Codec::kF16, "app-A"), a.view()), PutResult::kStored);
  EXPECT_FALSE(store->lookup(make_key(tokens, Codec::kF16, "app-B")));
  EXPECT_FALSE(store->lookup(make_key(tokens, Codec::kF16, "")));
  // The same chunk in B is a separate entry with B's data.
  ASSERT_EQ(store->put(make_key(tokens, Codec::kF16, "app-B"), b.view()), PutResult::kStored);
  auto ha = store->lookup(make_key(tokens, Codec::kF16, "app-A"));
  auto hb = store->lookup(make_key(tokens, Codec::kF16, "app-B"));
  ASSERT_TRUE(ha && hb);
  EXPECT_NE(ha->entry_id(), hb->entry_id());
  EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *ha), a));
  EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *hb), b));
  // Evicting in one namespace leaves the other.
  EXPECT_TRUE(store->remove(make_key(tokens, Codec::kF16, "app-A")));
  EXPECT_FALSE(store->lookup(make_key(tokens, Codec::kF16, "app-A")));
  EXPECT_TRUE(store->lookup(make_key(tokens, Codec::kF16, "app-B")));
}

TEST(FlashStore, EveryKeyFieldSeparatesEntries) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKey base = make_key(make_tokens(40, 5));
  ASSERT_EQ(store->put(base, make_kv(small_shape(), 5).view()), PutResult::kStored);
  EXPECT_TRUE(store->lookup(base));
  ChunkKey k = base;
  k.model_fingerprint = "model-B";
  EXPECT_FALSE(store->lookup(k));
  k = base;
  k.chunk_head = "system-prompt";
  EXPECT_FALSE(store->lookup(k));
  k = base;
  k.codec = Codec::kQ8;
  EXPECT_FALSE(store->lookup(k));
  k = base;
  k.tokens.back() += 1;
  EXPECT_FALSE(store->lookup(k));
  k = base;
  k.tokens.pop_back();
  EXPECT_FALSE(store->lookup(k));
  // Length prefixes: moving a byte between fields is a different key.
  k = base;
  k.model_fingerprint = "model-Ab";
  k.chunk_head = "os";
  EXPECT_NE(hash_key(k, Codec::kF16), hash_key(base, Codec::kF16));
  EXPECT_FALSE(store->lookup(k));
  EXPECT_EQ(store->stats().hits, 1u);
  EXPECT_EQ(store->stats().misses, 6u);
}

// Forces two entries to share a key hash by editing the index, as a real
// 64-bit collision would: lookups must still tell them apart by the full key.
TEST(FlashStore, HashCollisionsNeverReturnAnotherChunk) {
  TempDir dir;
  const ChunkKey a = make_key(make_tokens(40, 6));
  const ChunkKey b = make_key(make_tokens(40, 7));
  const ChunkKV kv_a = make_kv(small_shape(), 6), kv_b = make_kv(small_shape(), 7);
  {
    auto store = FlashStore::open(dir.path());
    ASSERT_EQ(store->put(a, kv_a.view()), PutResult::kStored);
    ASSERT_EQ(store->put(b, kv_b.view()), PutResult::kStored);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.sub("index.sqlite").c_str(), &db), SQLITE_OK);
  const std::string sql = "UPDATE entries SET key_hash=" +
                          std::to_string(static_cast<int64_t>(hash_key(a, Codec::kF16)));
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto store = FlashStore::open(dir.path());
  auto ha = store->lookup(a);
  ASSERT_TRUE(ha);
  EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *ha), kv_a));
  EXPECT_FALSE(store->lookup(b));  // b's row now sits under a's hash only
  // A key that differs from a only in tokens, under a's hash, is a miss.
  ChunkKey c = a;
  c.tokens = b.tokens;
  EXPECT_FALSE(store->lookup(c));
}

TEST(FlashStore, HandleReportsLayerBytesWithoutIo) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const KvShape s = small_shape();
  const ChunkKey key = make_key(make_tokens(40, 8), Codec::kF16);
  ASSERT_EQ(store->put(key, make_kv(s, 8).view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  uint64_t sum = 0;
  for (int l = 0; l < s.n_layers; ++l) {
    EXPECT_EQ(h->layer_bytes(l), 8 + 2 * 2 * s.layer_floats());  // header + raw f16 K and V
    sum += h->layer_bytes(l);
  }
  EXPECT_EQ(h->total_bytes(), sum);
  EXPECT_THROW(h->layer_bytes(s.n_layers), Error);
  std::vector<float> k(s.layer_floats()), v(s.layer_floats());
  EXPECT_THROW(store->fetch_layer(*h, -1, k.data(), v.data()), Error);
  EXPECT_THROW(store->fetch_layer(ChunkHandle{}, 0, k.data(), v.data()), Error);
  const StoreStats st = store->stats();
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.bytes, 64 + sum);  // blob header + segments
}

TEST(FlashStore, DuplicatePutIsAlreadyPresentAndKeepsTheFirst) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKey key = make_key(make_tokens(40, 9));
  const ChunkKV first = make_kv(small_shape(), 91);
  EXPECT_EQ(store->put(key, first.view()), PutResult::kStored);
  EXPECT_EQ(store->put(key, make_kv(small_shape(), 92).view()), PutResult::kAlreadyPresent);
  EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *store->lookup(key)), first));
  EXPECT_EQ(store->stats().entries, 1u);
  EXPECT_EQ(store->stats().put_duplicates, 1u);
}

TEST(FlashStore, RejectsBadInputWithInvalidArgument) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  ChunkKV kv = make_kv(small_shape(), 10);
  ChunkKVView view = kv.view();
  view.k.pop_back();
  EXPECT_THROW(store->put(make_key(make_tokens(40, 10)), view), Error);
  kv.v[17] = NAN;
  try {
    store->put(make_key(make_tokens(40, 10)), kv.view());
    ADD_FAILURE() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.sub("blobs")));
}

TEST(FlashStore, ClearRemovesEverythingIncludingPinned) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(store->put(make_key(make_tokens(40, 20 + i)), make_kv(small_shape(), i).view()),
              PutResult::kStored);
  }
  ASSERT_TRUE(store->pin(make_key(make_tokens(40, 20))));
  store->clear();
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_EQ(store->stats().bytes, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.sub("blobs")));
  EXPECT_FALSE(store->lookup(make_key(make_tokens(40, 20))));
}

}  // namespace
}  // namespace cb::cache
