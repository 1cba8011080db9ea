// The store's SQLite index (index.sqlite, WAL mode): one row per chunk entry
// with its full key, shape, blob file name, size, LRU clock and pin flag, and
// one row per layer segment (offset, size, checksum).
//
// Not thread-safe: FlashStore serializes calls with its own mutex.  Several
// processes may use one index file; writes take SQLite's write lock with
// BEGIN IMMEDIATE and wait up to the busy timeout for it.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/blob_format.h"
#include "cache/chunk_kv.h"
#include "platform/sqlite.h"

namespace cb::cache {

struct EntryRecord {
  int64_t id = 0;
  KvShape shape;
  Codec codec = Codec::kF16;
  std::string blob;  // file name within the blob directory
  uint64_t bytes = 0;
  bool pinned = false;
  std::vector<SegmentRef> segments;
};

struct BlobRow {
  int64_t id = 0;
  std::string blob;
  uint64_t bytes = 0;
};

class Index {
 public:
  // Opens or creates the index.  Throws Error(kFormat) if the file is not a
  // readable SQLite database (corrupt), Error(kUnsupported) if a newer build
  // wrote it, Error(kIo) for other failures.  read_only: opens an existing
  // index without writing anything (sqlite::open_read_only); every call
  // that writes then throws kIo.
  Index(const std::string& path, int busy_timeout_ms, bool read_only = false);
  ~Index();
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  // Exact match on every key field; the hash only narrows the search.
  std::optional<EntryRecord> find(const ChunkKey& key, Codec codec, uint64_t hash);
  // Marks an entry most recently used.
  void touch(int64_t id);

  enum class InsertStatus { kInserted, kDuplicate, kNoRoom };
  struct InsertOutcome {
    InsertStatus status = InsertStatus::kInserted;
    std::vector<std::string> evicted_blobs;  // rows gone; the caller unlinks the files
  };
  // In one transaction: skip if the key is already present, evict least
  // recently used unpinned entries until the new entry fits capacity, insert.
  InsertOutcome insert(const ChunkKey& key, Codec codec, uint64_t hash, const KvShape& shape,
                       const std::string& blob, uint64_t bytes,
                       const std::vector<SegmentRef>& segments, uint64_t capacity);

  // Deletes the row if it still names this blob (a stale handle must never
  // remove a newer entry).  True if a row was deleted.
  bool remove(int64_t id, const std::string& blob);
  bool set_pinned(int64_t id, bool pinned);
  // Deletes every row; returns their blob names.
  std::vector<std::string> remove_all();
  // Evicts unpinned entries, LRU first, until total bytes <= capacity.
  std::vector<std::string> trim_to(uint64_t capacity);

  std::vector<BlobRow> all_blobs();
  uint64_t entry_count();
  uint64_t total_bytes();

 private:
  class Transaction;
  void exec(const char* sql);
  sqlite::Statement prepare(const char* sql);
  [[noreturn]] void fail_sqlite(int rc, const char* what);
  // Throws kFormat (the store rebuilds the index) when no entry id is left.
  void check_ids_left();

  std::string path_;
  sqlite3* db_ = nullptr;
};

}  // namespace cb::cache
