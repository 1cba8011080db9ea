#include "cache/index.h"

#include <cstring>

#include "cache/eviction.h"
#include "platform/error.h"

namespace cb::cache {

namespace {

constexpr int kSchemaVersion = 1;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS entries(
  id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: stale handles stay stale
  key_hash    INTEGER NOT NULL,
  namespace   BLOB    NOT NULL,
  model       BLOB    NOT NULL,
  chunk_head  BLOB    NOT NULL,
  codec       INTEGER NOT NULL,
  tokens      BLOB    NOT NULL,                   -- int32 ids, host byte order
  n_layers    INTEGER NOT NULL,
  n_tokens    INTEGER NOT NULL,
  n_head_kv   INTEGER NOT NULL,
  head_dim    INTEGER NOT NULL,
  blob        TEXT    NOT NULL UNIQUE,
  bytes       INTEGER NOT NULL,
  last_access INTEGER NOT NULL,                   -- logical clock shared by all processes
  pinned      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_by_key ON entries(key_hash);
CREATE INDEX IF NOT EXISTS entries_by_access ON entries(last_access);
CREATE TABLE IF NOT EXISTS segments(
  entry_id INTEGER NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
  layer    INTEGER NOT NULL,
  offset   INTEGER NOT NULL,
  size     INTEGER NOT NULL,
  checksum INTEGER NOT NULL,
  PRIMARY KEY(entry_id, layer)
) WITHOUT ROWID;
)sql";

}  // namespace

// BEGIN IMMEDIATE takes the write lock up front, so two writers never
// deadlock upgrading read locks; the destructor rolls back unless committed.
class Index::Transaction {
 public:
  explicit Transaction(Index* idx) : idx_(idx) { idx_->exec("BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!done_) {
      try {
        idx_->exec("ROLLBACK");
      } catch (const Error&) {
        // Nothing to add: the original error is already propagating.
      }
    }
  }
  Transaction(const Transaction&) = delete;
  void commit() {
    idx_->exec("COMMIT");
    done_ = true;
  }

 private:
  Index* idx_;
  bool done_ = false;
};

Index::Index(const std::string& path, int busy_timeout_ms, bool read_only) : path_(path) {
  if (read_only) {
    bool immutable = false;
    db_ = sqlite::open_read_only(path, path, &immutable);
  } else {
    const int rc =
        sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc != SQLITE_OK) {
      const std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
      sqlite3_close(db_);
      db_ = nullptr;
      fail(ErrorCode::kIo, "open " + path + ": " + msg);
    }
  }
  try {
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, busy_timeout_ms);
    sqlite::check_readable(db_, path_);
    if (!read_only) {
      exec("PRAGMA journal_mode=WAL");
      // NORMAL in WAL mode: a power cut may lose the last commits but never
      // corrupts; a lost row only leaves an orphan blob that open() removes.
      exec("PRAGMA synchronous=NORMAL");
    }
    exec("PRAGMA foreign_keys=ON");
    int version = 0;
    {
      sqlite::Statement s = prepare("PRAGMA user_version");
      if (s.step()) version = static_cast<int>(s.i64(0));
    }
    if (version > kSchemaVersion) {
      fail(ErrorCode::kUnsupported, path + ": index schema version " + std::to_string(version) +
                                        " is newer than this build supports (" +
                                        std::to_string(kSchemaVersion) + ")");
    }
    if (version < kSchemaVersion && read_only) {
      fail(ErrorCode::kIo, path + ": holds no index yet and cannot be written");
    }
    if (version < kSchemaVersion) {
      Transaction txn(this);
      exec(kSchema);
      exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
      txn.commit();
    }
    // After the schema is made: an index of this version must have it.
    // integrity_check there takes 0.17 s against quick_check's 0.13-0.16 s
    // on an index of 20,000 chunks of 28 layers (98 MB).
    sqlite::check_intact(db_, kSchema, path_);
    if (!read_only) check_ids_left();
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

void Index::check_ids_left() {
  // AUTOINCREMENT gives no id past the largest integer ever used, and says
  // so as "database or disk is full".  A put a nanosecond would take 146
  // years to pass 2^62: an id or a sequence there is damage.
  sqlite::Statement s = prepare(
      "SELECT (SELECT IFNULL(MAX(id), 0) FROM entries) >= ?1 OR EXISTS(SELECT 1 FROM "
      "sqlite_sequence WHERE name='entries' AND (typeof(seq) != 'integer' OR seq >= ?1))");
  s.bind(1, int64_t{1} << 62);
  if (s.step() && s.i64(0) != 0) {
    fail(ErrorCode::kFormat, path_ + ": damaged: its entry ids have run out");
  }
}

Index::~Index() {
  sqlite3_close(db_);
}

void Index::fail_sqlite(int rc, const char* what) {
  sqlite::fail(db_, rc, path_, what);
}

void Index::exec(const char* sql) {
  sqlite::exec(db_, sql, path_);
}

sqlite::Statement Index::prepare(const char* sql) {
  return {db_, sql, path_};
}

std::optional<EntryRecord> Index::find(const ChunkKey& key, Codec codec, uint64_t hash) {
  sqlite::Statement s = prepare(
      "SELECT id, n_layers, n_tokens, n_head_kv, head_dim, blob, bytes, pinned FROM entries "
      "WHERE key_hash=?1 AND namespace=?2 AND model=?3 AND chunk_head=?4 AND codec=?5 "
      "AND tokens=?6");
  s.bind_u64(1, hash)
      .bind_blob(2, key.ns.data(), key.ns.size())
      .bind_blob(3, key.model_fingerprint.data(), key.model_fingerprint.size())
      .bind_blob(4, key.chunk_head.data(), key.chunk_head.size())
      .bind(5, static_cast<int64_t>(codec))
      .bind_blob(6, key.tokens.data(), key.tokens.size() * sizeof(int32_t));
  if (!s.step()) return std::nullopt;
  EntryRecord r;
  r.id = s.i64(0);
  r.shape = {static_cast<int32_t>(s.i64(1)), static_cast<int32_t>(s.i64(2)),
             static_cast<int32_t>(s.i64(3)), static_cast<int32_t>(s.i64(4))};
  r.codec = codec;
  r.blob = s.text(5);
  r.bytes = static_cast<uint64_t>(s.i64(6));
  r.pinned = s.i64(7) != 0;

  sqlite::Statement seg =
      prepare("SELECT layer, offset, size, checksum FROM segments WHERE entry_id=? ORDER BY layer");
  seg.bind(1, r.id);
  while (seg.step()) {
    if (seg.i64(0) != static_cast<int64_t>(r.segments.size())) break;  // a gap: treated below
    r.segments.push_back(
        {static_cast<uint64_t>(seg.i64(1)), static_cast<uint32_t>(seg.i64(2)), seg.u64(3)});
  }
  // A row whose segment list does not cover every layer cannot be served;
  // report it as a damaged entry (empty segment list) for the caller to drop.
  if (r.segments.size() != static_cast<size_t>(r.shape.n_layers)) r.segments.clear();
  return r;
}

void Index::touch(int64_t id) {
  sqlite::Statement s = prepare(
      "UPDATE entries SET last_access=(SELECT IFNULL(MAX(last_access),0)+1 FROM entries) "
      "WHERE id=?");
  s.bind(1, id);
  s.step();
}

Index::InsertOutcome Index::insert(const ChunkKey& key, Codec codec, uint64_t hash,
                                   const KvShape& shape, const std::string& blob, uint64_t bytes,
                                   const std::vector<SegmentRef>& segments, uint64_t capacity) {
  InsertOutcome out;
  Transaction txn(this);
  if (find(key, codec, hash)) {
    out.status = InsertStatus::kDuplicate;
    txn.commit();
    return out;
  }
  const uint64_t used = total_bytes();
  std::vector<EvictionCandidate> candidates;
  std::vector<std::string> candidate_blobs;
  if (used + bytes > capacity) {
    sqlite::Statement s =
        prepare("SELECT id, bytes, blob FROM entries WHERE pinned=0 ORDER BY last_access, id");
    while (s.step()) {
      candidates.push_back({s.i64(0), static_cast<uint64_t>(s.i64(1))});
      candidate_blobs.push_back(s.text(2));
    }
  }
  const std::optional<size_t> n_evict = plan_eviction(used, bytes, capacity, candidates);
  if (!n_evict) {
    out.status = InsertStatus::kNoRoom;
    return out;  // rolls back
  }
  for (size_t i = 0; i < *n_evict; ++i) {
    sqlite::Statement d = prepare("DELETE FROM entries WHERE id=?");
    d.bind(1, candidates[i].id);
    d.step();
    out.evicted_blobs.push_back(candidate_blobs[i]);
  }

  sqlite::Statement ins = prepare(
      "INSERT INTO entries(key_hash, namespace, model, chunk_head, codec, tokens, n_layers, "
      "n_tokens, n_head_kv, head_dim, blob, bytes, last_access) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,"
      "?10,?11,?12,(SELECT IFNULL(MAX(last_access),0)+1 FROM entries))");
  ins.bind_u64(1, hash)
      .bind_blob(2, key.ns.data(), key.ns.size())
      .bind_blob(3, key.model_fingerprint.data(), key.model_fingerprint.size())
      .bind_blob(4, key.chunk_head.data(), key.chunk_head.size())
      .bind(5, static_cast<int64_t>(codec))
      .bind_blob(6, key.tokens.data(), key.tokens.size() * sizeof(int32_t))
      .bind(7, shape.n_layers)
      .bind(8, shape.n_tokens)
      .bind(9, shape.n_head_kv)
      .bind(10, shape.head_dim)
      .bind(11, blob)
      .bind(12, static_cast<int64_t>(bytes));
  ins.step();
  const int64_t id = sqlite3_last_insert_rowid(db_);
  // Segment rows under a new id belong to no entry: a damaged index (or a
  // writer without foreign keys) left them.  Kept, they would refuse this
  // entry's segments, and every later put would get the same id again.
  sqlite::Statement stray = prepare("DELETE FROM segments WHERE entry_id=?");
  stray.bind(1, id);
  stray.step();
  for (size_t l = 0; l < segments.size(); ++l) {
    sqlite::Statement seg =
        prepare("INSERT INTO segments(entry_id, layer, offset, size, checksum) VALUES(?,?,?,?,?)");
    seg.bind(1, id)
        .bind(2, static_cast<int64_t>(l))
        .bind(3, static_cast<int64_t>(segments[l].offset))
        .bind(4, segments[l].size)
        .bind_u64(5, segments[l].checksum);
    seg.step();
  }
  txn.commit();
  return out;
}

bool Index::remove(int64_t id, const std::string& blob) {
  sqlite::Statement s = prepare("DELETE FROM entries WHERE id=? AND blob=?");
  s.bind(1, id).bind(2, blob);
  s.step();
  return sqlite3_changes(db_) > 0;
}

bool Index::set_pinned(int64_t id, bool pinned) {
  sqlite::Statement s = prepare("UPDATE entries SET pinned=? WHERE id=?");
  s.bind(1, pinned ? 1 : 0).bind(2, id);
  s.step();
  return sqlite3_changes(db_) > 0;
}

std::vector<std::string> Index::remove_all() {
  std::vector<std::string> blobs;
  Transaction txn(this);
  {
    sqlite::Statement s = prepare("SELECT blob FROM entries");
    while (s.step()) blobs.push_back(s.text(0));
  }
  exec("DELETE FROM entries");
  txn.commit();
  return blobs;
}

std::vector<std::string> Index::trim_to(uint64_t capacity) {
  std::vector<std::string> blobs;
  Transaction txn(this);
  uint64_t used = total_bytes();
  if (used <= capacity) return blobs;
  std::vector<EvictionCandidate> candidates;
  std::vector<std::string> names;
  {
    sqlite::Statement s =
        prepare("SELECT id, bytes, blob FROM entries WHERE pinned=0 ORDER BY last_access, id");
    while (s.step()) {
      candidates.push_back({s.i64(0), static_cast<uint64_t>(s.i64(1))});
      names.push_back(s.text(2));
    }
  }
  // Pinned entries alone may exceed capacity; then evict everything else.
  const size_t n = plan_eviction(used, 0, capacity, candidates).value_or(candidates.size());
  for (size_t i = 0; i < n; ++i) {
    sqlite::Statement d = prepare("DELETE FROM entries WHERE id=?");
    d.bind(1, candidates[i].id);
    d.step();
    blobs.push_back(names[i]);
  }
  txn.commit();
  return blobs;
}

std::vector<BlobRow> Index::all_blobs() {
  std::vector<BlobRow> rows;
  sqlite::Statement s = prepare("SELECT id, blob, bytes FROM entries");
  while (s.step()) rows.push_back({s.i64(0), s.text(1), static_cast<uint64_t>(s.i64(2))});
  return rows;
}

uint64_t Index::entry_count() {
  sqlite::Statement s = prepare("SELECT COUNT(*) FROM entries");
  return s.step() ? static_cast<uint64_t>(s.i64(0)) : 0;
}

uint64_t Index::total_bytes() {
  sqlite::Statement s = prepare("SELECT IFNULL(SUM(bytes),0) FROM entries");
  return s.step() ? static_cast<uint64_t>(s.i64(0)) : 0;
}

}  // namespace cb::cache
