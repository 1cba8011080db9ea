// Damage and crashes: corrupt, truncated and missing blobs, missing rows,
// orphans, leftover temp files, a corrupt index, and a writer killed with
// SIGKILL mid-stream.  Every case must end as a miss (entry dropped), never a
// crash or wrong data.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "cache/flash_store.h"
#include "cache_test_util.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

using namespace testing;
namespace fs = std::filesystem;

std::vector<std::string> blob_files(const TempDir& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir.sub("blobs"))) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

class Damage : public ::testing::TestWithParam<Codec> {};

TEST_P(Damage, FlippedByteInEachLayerIsAMissAndDropsTheEntry) {
  const KvShape s = small_shape();
  for (int layer = 0; layer < s.n_layers; ++layer) {
    TempDir dir;
    auto store = FlashStore::open(dir.path());
    const ChunkKey key = make_key(make_tokens(40, 1), GetParam());
    ASSERT_EQ(store->put(key, make_kv(s, 1).view()), PutResult::kStored);
    auto h = store->lookup(key);
    ASSERT_TRUE(h);
    uint64_t offset = 64;
    for (int l = 0; l < layer; ++l) offset += h->layer_bytes(l);
    flip_byte(blob_files(dir).at(0), offset + h->layer_bytes(layer) / 2);
    std::vector<float> k(s.layer_floats()), v(s.layer_floats());
    for (int l = 0; l < layer; ++l) EXPECT_TRUE(store->fetch_layer(*h, l, k.data(), v.data()));
    EXPECT_FALSE(store->fetch_layer(*h, layer, k.data(), v.data()));
    EXPECT_EQ(store->stats().corrupt_drops, 1u);
    EXPECT_EQ(store->stats().entries, 0u);
    EXPECT_FALSE(store->lookup(key));
    EXPECT_TRUE(blob_files(dir).empty());
    // A recompute can store it again.
    EXPECT_EQ(store->put(key, make_kv(s, 1).view()), PutResult::kStored);
    EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Damage, ::testing::Values(Codec::kF16, Codec::kQ8, Codec::kQ4),
                         [](const auto& info) { return std::string(codec_name(info.param)); });

TEST(Integrity, TruncatedBlobIsAMissAtLookup) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKey key = make_key(make_tokens(40, 2));
  ASSERT_EQ(store->put(key, make_kv(small_shape(), 2).view()), PutResult::kStored);
  const std::string blob = blob_files(dir).at(0);
  fs::resize_file(blob, fs::file_size(blob) - 100);
  EXPECT_FALSE(store->lookup(key));
  EXPECT_EQ(store->stats().corrupt_drops, 1u);
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_FALSE(fs::exists(blob));
}

TEST(Integrity, TruncationAfterLookupIsAMissAtFetch) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const KvShape s = small_shape();
  const ChunkKey key = make_key(make_tokens(40, 3));
  ASSERT_EQ(store->put(key, make_kv(s, 3).view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  fs::resize_file(blob_files(dir).at(0), 64 + h->layer_bytes(0) + 10);
  std::vector<float> k(s.layer_floats()), v(s.layer_floats());
  EXPECT_TRUE(store->fetch_layer(*h, 0, k.data(), v.data()));
  EXPECT_FALSE(store->fetch_layer(*h, 1, k.data(), v.data()));
  EXPECT_FALSE(store->lookup(key));
}

TEST(Integrity, MissingBlobIsAMissAndRemovesTheRow) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKey key = make_key(make_tokens(40, 4));
  ASSERT_EQ(store->put(key, make_kv(small_shape(), 4).view()), PutResult::kStored);
  fs::remove(blob_files(dir).at(0));
  EXPECT_FALSE(store->lookup(key));
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_EQ(store->stats().corrupt_drops, 1u);
}

TEST(Integrity, HandleOutlivesEvictionOfItsEntry) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const KvShape s = small_shape();
  const ChunkKey key = make_key(make_tokens(40, 5));
  const ChunkKV kv = make_kv(s, 5);
  ASSERT_EQ(store->put(key, kv.view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(store->remove(key));
  auto got = fetch_all(*store, *h);  // the open descriptor still reads the old data
  ASSERT_TRUE(got);
  EXPECT_TRUE(equals_f16_of(*got, kv));
}

TEST(Integrity, ReopenReconcilesOrphansBothWays) {
  TempDir dir;
  const ChunkKey a = make_key(make_tokens(40, 6)), b = make_key(make_tokens(40, 7));
  {
    auto store = FlashStore::open(dir.path());
    ASSERT_EQ(store->put(a, make_kv(small_shape(), 6).view()), PutResult::kStored);
    ASSERT_EQ(store->put(b, make_kv(small_shape(), 7).view()), PutResult::kStored);
  }
  // Row without blob: delete b's file.  Blob without row: drop a's row and add
  // a stray blob and a dead writer's temp file.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.sub("index.sqlite").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "SELECT blob FROM entries ORDER BY id", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const std::string blob_a = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const std::string blob_b = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  ASSERT_EQ(sqlite3_exec(db, "DELETE FROM entries WHERE id=(SELECT MIN(id) FROM entries)", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  fs::remove(dir.sub("blobs/" + blob_b));
  std::ofstream(dir.sub("blobs/0123456789abcdef-0123456789abcdef.kv")) << "stray";
  std::ofstream(dir.sub("blobs/0123456789abcdef-fedcba9876543210.kv.tmp")) << "half written";

  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_TRUE(blob_files(dir).empty()) << "orphans left: " << blob_files(dir).size();
  EXPECT_FALSE(store->lookup(a));
  EXPECT_FALSE(store->lookup(b));
  // Usable afterwards.
  EXPECT_EQ(store->put(a, make_kv(small_shape(), 6).view()), PutResult::kStored);
  EXPECT_TRUE(fetch_all(*store, *store->lookup(a)));
}

// Opening a store sweeps only its own orphaned names; a user's files in
// blobs/, or anything behind a symlinked blobs/, stay.
TEST(Integrity, OpenDeletesNoFileOfSomeoneElse) {
  TempDir dir;
  FlashStore::open(dir.path());
  const std::string mine = "0123456789abcdef-0123456789abcdef.kv";
  for (const char* name : {"notes.txt", "photo.kv", "backup.kv.tmp"})
    std::ofstream(dir.sub(std::string("blobs/") + name)) << "user data";
  std::ofstream(dir.sub("blobs/" + mine)) << "orphan";
  FlashStore::open(dir.path());
  EXPECT_EQ(blob_files(dir).size(), 3u);
  EXPECT_FALSE(fs::exists(dir.sub("blobs/" + mine)));

  TempDir linked, target;
  fs::create_directory_symlink(target.path(), linked.sub("blobs"));
  std::ofstream(target.sub("notes.txt")) << "user data";
  std::ofstream(target.sub(mine)) << "looks like a blob";
  FlashStore::open(linked.path());
  EXPECT_TRUE(fs::exists(target.sub("notes.txt")));
  EXPECT_TRUE(fs::exists(target.sub(mine)));
}

// Another store's index in place of this one's (copied in, or its -wal
// applied): every row lacks its blob and every blob lacks its row.  The
// rows go, the blobs are moved to quarantine/, not deleted.
TEST(Integrity, ForeignIndexQuarantinesTheBlobs) {
  TempDir dir, other;
  std::vector<ChunkKey> keys;
  {
    auto store = FlashStore::open(dir.path());
    for (int i = 0; i < 12; ++i) {
      keys.push_back(make_key(make_tokens(40, 100 + i)));
      ASSERT_EQ(store->put(keys.back(), make_kv(small_shape(), i).view()), PutResult::kStored);
    }
    auto foreign = FlashStore::open(other.path());
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(foreign->put(make_key(make_tokens(40, 200 + i)), make_kv(small_shape(), i).view()),
                PutResult::kStored);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    fs::remove(dir.sub(std::string("index.sqlite") + suffix));
    if (fs::exists(other.sub(std::string("index.sqlite") + suffix)))
      fs::copy_file(other.sub(std::string("index.sqlite") + suffix),
                    dir.sub(std::string("index.sqlite") + suffix));
  }
  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_EQ(store->stats().quarantined, 12u);
  EXPECT_TRUE(blob_files(dir).empty());
  size_t kept = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.sub("quarantine")))
    kept += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(kept, 12u);
  // The open says how many, where they went and how to get them back.
  const std::string report = store->open_report();
  EXPECT_NE(report.find("12 chunk(s)"), std::string::npos) << report;
  EXPECT_NE(report.find(dir.sub("quarantine/")), std::string::npos) << report;
  EXPECT_NE(report.find("to get them back"), std::string::npos) << report;
  EXPECT_FALSE(store->stats().read_only);
  EXPECT_FALSE(store->lookup(keys[0]));
  EXPECT_EQ(store->put(keys[0], make_kv(small_shape(), 0).view()), PutResult::kStored);
  EXPECT_TRUE(fetch_all(*store, *store->lookup(keys[0])));
}

TEST(Integrity, CorruptIndexIsRebuiltEmpty) {
  TempDir dir;
  const ChunkKey key = make_key(make_tokens(40, 8));
  {
    auto store = FlashStore::open(dir.path());
    ASSERT_EQ(store->put(key, make_kv(small_shape(), 8).view()), PutResult::kStored);
  }
  {
    std::ofstream f(dir.sub("index.sqlite"), std::ios::binary | std::ios::trunc);
    f << std::string(8192, 'x');
  }
  fs::remove(dir.sub("index.sqlite-wal"));
  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_FALSE(store->lookup(key));
  EXPECT_TRUE(blob_files(dir).empty());  // the old blobs became orphans
  EXPECT_TRUE(fs::exists(dir.sub("index.sqlite.corrupt")));
  EXPECT_EQ(store->put(key, make_kv(small_shape(), 8).view()), PutResult::kStored);
}

TEST(Integrity, CorruptIndexIsAClearErrorWhenRebuildIsOff) {
  TempDir dir;
  { std::ofstream(dir.sub("index.sqlite"), std::ios::binary) << std::string(8192, 'x'); }
  StoreOptions opt;
  opt.rebuild_corrupt_index = false;
  try {
    FlashStore::open(dir.path(), opt);
    ADD_FAILURE() << "opened a corrupt index";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat);
    EXPECT_NE(std::string(e.what()).find("index.sqlite"), std::string::npos) << e.what();
  }
}

// Runs SQL on a closed store's index, as damage or another writer would.
void edit_index(const TempDir& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.sub("index.sqlite").c_str(), &db), SQLITE_OK);
  char* why = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &why), SQLITE_OK) << why;
  sqlite3_free(why);
  sqlite3_close(db);
}

// A store holding one chunk, closed; its key.
ChunkKey store_one_chunk(const TempDir& dir) {
  const ChunkKey key = make_key(make_tokens(40, 9));
  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->put(key, make_kv(small_shape(), 9).view()), PutResult::kStored);
  return key;
}

// Damage that leaves SQLite a readable database but not an index this store
// can use is found at open, and the index is rebuilt.
void expect_rebuilt(const TempDir& dir, const ChunkKey& key) {
  auto store = FlashStore::open(dir.path());
  EXPECT_TRUE(fs::exists(dir.sub("index.sqlite.corrupt")));
  const std::string report = store->open_report();
  EXPECT_NE(report.find("index could not be used (" + dir.sub("index.sqlite") + ": damaged: "),
            std::string::npos)
      << report;
  EXPECT_EQ(store->stats().entries, 0u);
  EXPECT_FALSE(store->lookup(key));
  EXPECT_EQ(store->put(key, make_kv(small_shape(), 9).view()), PutResult::kStored);
  EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
}

TEST(Integrity, SqlIndexThatDisagreesWithItsTableIsRebuilt) {
  TempDir dir;
  const ChunkKey key = store_one_chunk(dir);
  // The b-trees of the key-hash and access-clock indexes swapped: the same
  // SQL and well-formed pages, other contents.  SQLite's quick check does not
  // compare an index with its table.
  edit_index(dir,
             "PRAGMA writable_schema=ON; UPDATE sqlite_master SET rootpage=(SELECT "
             "sum(rootpage) FROM sqlite_master WHERE name IN ('entries_by_key', "
             "'entries_by_access')) - rootpage WHERE name IN ('entries_by_key', "
             "'entries_by_access');");
  expect_rebuilt(dir, key);
}

TEST(Integrity, IndexWithAnotherSchemaIsRebuilt) {
  TempDir dir;
  const ChunkKey key = store_one_chunk(dir);
  edit_index(dir,
             "PRAGMA writable_schema=ON; UPDATE sqlite_master SET sql=replace(sql, 'pinned', "
             "'pinnxd') WHERE name='entries';");
  expect_rebuilt(dir, key);
}

TEST(Integrity, SchemaTextThatDiffersInCommentsAndLayoutIsKept) {
  TempDir dir;
  const ChunkKey key = store_one_chunk(dir);
  edit_index(dir,
             "PRAGMA writable_schema=ON; UPDATE sqlite_master SET sql=replace(replace(sql, "
             "'-- never reused', '--  another comment'), '  ', ' ') WHERE name='entries';");
  auto store = FlashStore::open(dir.path());
  EXPECT_FALSE(fs::exists(dir.sub("index.sqlite.corrupt")));
  EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
}

TEST(Integrity, IndexWithAnUnsupportedHeaderIsRebuilt) {
  TempDir dir;
  const ChunkKey key = store_one_chunk(dir);
  {
    // Byte 47: the low byte of the schema format number (1 to 4).
    std::fstream f(dir.sub("index.sqlite"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(47);
    f.put(static_cast<char>(63));
  }
  expect_rebuilt(dir, key);
}

TEST(Integrity, StraySegmentRowsDoNotBlockNewChunks) {
  TempDir dir;
  store_one_chunk(dir);
  // Segment rows under the id the next entry gets, as a damaged index or a
  // writer without foreign keys leaves them.
  edit_index(dir,
             "INSERT INTO segments SELECT entry_id + 1, layer, offset, size, checksum "
             "FROM segments");
  auto store = FlashStore::open(dir.path());
  for (int i = 0; i < 3; ++i) {
    const ChunkKey key = make_key(make_tokens(40, 20 + i));
    ASSERT_EQ(store->put(key, make_kv(small_shape(), 20 + i).view()), PutResult::kStored);
    EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
  }
}

TEST(Integrity, ExhaustedEntryIdsAreRebuilt) {
  // An id at the largest integer leaves AUTOINCREMENT no id to give: every
  // put would fail with "database or disk is full", on a disk with room.
  for (const char* edit : {"UPDATE entries SET id=9223372036854775807",
                           "UPDATE sqlite_sequence SET seq=9223372036854775807",
                           "UPDATE sqlite_sequence SET seq='x'"}) {
    SCOPED_TRACE(edit);
    TempDir dir;
    store_one_chunk(dir);
    edit_index(dir, edit);
    auto store = FlashStore::open(dir.path());
    const ChunkKey key = make_key(make_tokens(40, 30));
    ASSERT_EQ(store->put(key, make_kv(small_shape(), 30).view()), PutResult::kStored);
    EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
  }
}

TEST(Integrity, SegmentOffsetThatWrapsIsAMiss) {
  TempDir dir;
  const ChunkKey key = store_one_chunk(dir);
  // An offset of 2^64 - 1 plus the segment's size wraps to less than the
  // blob's size.
  edit_index(dir, "UPDATE segments SET offset=-1 WHERE layer=1");
  auto store = FlashStore::open(dir.path());
  EXPECT_FALSE(store->lookup(key));
  EXPECT_EQ(store->stats().corrupt_drops, 1u);
}

// The deterministic KV a key implies, so any reader can verify what it got.
ChunkKV kv_for(int i) {
  return make_kv(small_shape(), 1000 + i);
}
ChunkKey key_for(int i) {
  return make_key(make_tokens(40, 1000 + i));
}

// A child process writes entries as fast as it can and is SIGKILLed at a
// random moment.  After each kill the store must reopen cleanly, leave no
// temp files, and serve every surviving entry with exactly its data.
TEST(Integrity, WriterKilledAtRandomPointsLeavesAConsistentStore) {
  TempDir dir;
  std::mt19937 rng(12345);
  int next = 0;
  int killed_mid_stream = 0;  // rounds where the child died with puts left to do
  for (int round = 0; round < 8; ++round) {
    const int first = next;
    next += 200;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        auto store = FlashStore::open(dir.path());
        for (int i = first; i < first + 200; ++i) store->put(key_for(i), kv_for(i).view());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer: %s\n", e.what());
        _exit(2);
      }
      _exit(0);
    }
    usleep(5000 + rng() % 60000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
    killed_mid_stream += WIFSIGNALED(status);

    auto store = FlashStore::open(dir.path());
    for (const std::string& f : blob_files(dir)) {
      EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
    }
    uint64_t found = 0;
    for (int i = 0; i < next; ++i) {
      auto h = store->lookup(key_for(i));
      if (!h) continue;
      ++found;
      auto got = fetch_all(*store, *h);
      ASSERT_TRUE(got) << "entry " << i << " failed its checksum after a crash";
      ASSERT_TRUE(equals_f16_of(*got, kv_for(i))) << i;
    }
    EXPECT_EQ(found, store->stats().entries);
    EXPECT_EQ(blob_files(dir).size(), found);
    EXPECT_EQ(store->stats().corrupt_drops, 0u);
  }
  EXPECT_GT(killed_mid_stream, 0) << "the writer always finished; the test killed nothing";
}

}  // namespace
}  // namespace cb::cache
