// A flash store's index row is read back like any stored value: a row whose
// shape is not one its key can have (a token count other than the key's,
// as an edited or foreign index could hold) is a miss, never a handle whose
// reads would write more rows than the caller holds.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "cache/flash_store.h"
#include "cache_test_util.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

using testing::make_key;
using testing::make_kv;
using testing::make_tokens;
using testing::small_shape;
using testing::TempDir;

void exec(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
}

TEST(StoreShape, AnIndexRowClaimingAnotherTokenCountIsAMiss) {
  TempDir dir;
  const ChunkKey key = make_key(make_tokens(40, 1));
  for (const char* forged : {"n_tokens = 160", "n_tokens = 2147483647", "n_layers = 0"}) {
    {
      auto store = FlashStore::open(dir.path());
      ASSERT_EQ(store->put(key, make_kv(small_shape(), 1).view()), PutResult::kStored);
      ASSERT_TRUE(store->lookup(key));
    }
    exec(dir.sub("index.sqlite"), std::string("UPDATE entries SET ") + forged);
    auto store = FlashStore::open(dir.path());
    EXPECT_FALSE(store->lookup(key)) << forged;
  }
}

TEST(StoreShape, APutWhoseKvDoesNotMatchItsKeyIsRefused) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  EXPECT_THROW(store->put(make_key(make_tokens(39, 1)), make_kv(small_shape(), 1).view()), Error);
}

}  // namespace
}  // namespace cb::cache
