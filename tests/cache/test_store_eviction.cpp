// Capacity: LRU by last access, pinning, accounting, shrinking capacity.
#include <gtest/gtest.h>

#include "cache/flash_store.h"
#include "cache_test_util.h"

namespace cb::cache {
namespace {

using namespace testing;

// Size of one small_shape() entry under f16, measured once.
uint64_t entry_bytes() {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  store->put(make_key(make_tokens(40, 0)), make_kv(small_shape(), 0).view());
  return store->stats().bytes;
}

ChunkKey key_n(int i) {
  return make_key(make_tokens(40, 100 + i));
}

std::unique_ptr<FlashStore> store_with_room_for(const TempDir& dir, int entries) {
  StoreOptions opt;
  opt.capacity_bytes = entries * entry_bytes();
  return FlashStore::open(dir.path(), opt);
}

TEST(Eviction, LeastRecentlyUsedGoesFirst) {
  TempDir dir;
  auto store = store_with_room_for(dir, 3);
  const ChunkKV kv = make_kv(small_shape(), 1);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(store->put(key_n(i), kv.view()), PutResult::kStored);
  ASSERT_TRUE(store->lookup(key_n(0)));  // 0 becomes most recent: order 1, 2, 0
  ASSERT_EQ(store->put(key_n(3), kv.view()), PutResult::kStored);
  EXPECT_FALSE(store->lookup(key_n(1)));
  EXPECT_TRUE(store->lookup(key_n(2)));  // order now 0, 3, 2
  ASSERT_EQ(store->put(key_n(4), kv.view()), PutResult::kStored);
  EXPECT_FALSE(store->lookup(key_n(0)));
  EXPECT_TRUE(store->lookup(key_n(3)));
  EXPECT_TRUE(store->lookup(key_n(2)));
  EXPECT_TRUE(store->lookup(key_n(4)));
  const StoreStats st = store->stats();
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.entries, 3u);
  EXPECT_LE(st.bytes, st.capacity_bytes);
  // Evicted blobs are gone from disk too.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.sub("blobs")))
    files += !!e.is_regular_file();
  EXPECT_EQ(files, 3u);
}

TEST(Eviction, PinnedEntriesAreExempt) {
  TempDir dir;
  auto store = store_with_room_for(dir, 2);
  const ChunkKV kv = make_kv(small_shape(), 2);
  ASSERT_EQ(store->put(key_n(0), kv.view()), PutResult::kStored);
  ASSERT_EQ(store->put(key_n(1), kv.view()), PutResult::kStored);
  ASSERT_TRUE(store->pin(key_n(0)));  // the oldest, but pinned
  EXPECT_FALSE(store->pin(key_n(9)));
  ASSERT_EQ(store->put(key_n(2), kv.view()), PutResult::kStored);
  EXPECT_TRUE(store->lookup(key_n(0)));
  EXPECT_FALSE(store->lookup(key_n(1)));
  ASSERT_TRUE(store->pin(key_n(2)));
  // Everything pinned: a new entry finds no room and nothing is lost.
  EXPECT_EQ(store->put(key_n(3), kv.view()), PutResult::kNoRoom);
  EXPECT_TRUE(store->lookup(key_n(0)));
  EXPECT_TRUE(store->lookup(key_n(2)));
  EXPECT_EQ(store->stats().put_no_room, 1u);
  // Unpinning makes room again.
  ASSERT_TRUE(store->unpin(key_n(0)));
  EXPECT_EQ(store->put(key_n(3), kv.view()), PutResult::kStored);
  EXPECT_FALSE(store->lookup(key_n(0)));
}

TEST(Eviction, EntryLargerThanCapacityIsRefused) {
  TempDir dir;
  StoreOptions opt;
  opt.capacity_bytes = entry_bytes() - 1;
  auto store = FlashStore::open(dir.path(), opt);
  EXPECT_EQ(store->put(key_n(0), make_kv(small_shape(), 3).view()), PutResult::kNoRoom);
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.sub("blobs")));
}

TEST(Eviction, BytesAreAccountedExactlyAndNeverExceedCapacity) {
  TempDir dir;
  const uint64_t capacity = 5 * entry_bytes() + entry_bytes() / 2;
  StoreOptions opt;
  opt.capacity_bytes = capacity;
  auto store = FlashStore::open(dir.path(), opt);
  // Mixed codecs give entries of different sizes.
  const Codec codecs[] = {Codec::kF16, Codec::kQ8, Codec::kQ4};
  for (int i = 0; i < 40; ++i) {
    const ChunkKey key = make_key(make_tokens(40, 200 + i), codecs[i % 3]);
    ASSERT_NE(store->put(key, make_kv(small_shape(), i).view()), PutResult::kAlreadyPresent);
    const StoreStats st = store->stats();
    ASSERT_LE(st.bytes, capacity) << i;
    uint64_t on_disk = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.sub("blobs")))
      on_disk += e.file_size();
    ASSERT_EQ(on_disk, st.bytes) << i;
  }
}

TEST(Eviction, ReopeningWithLessCapacityTrims) {
  TempDir dir;
  {
    auto store = FlashStore::open(dir.path());
    for (int i = 0; i < 4; ++i) store->put(key_n(i), make_kv(small_shape(), i).view());
    store->lookup(key_n(0));  // most recent
  }
  auto store = store_with_room_for(dir, 2);
  EXPECT_EQ(store->stats().entries, 2u);
  EXPECT_TRUE(store->lookup(key_n(0)));
  EXPECT_TRUE(store->lookup(key_n(3)));
}

}  // namespace
}  // namespace cb::cache
