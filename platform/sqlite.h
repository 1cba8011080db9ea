// The one wrapper over SQLite's C API, for every database of the runtime
// and the samples (the chunk-store index, the calibration database, the RAG
// assistant's corpus): prepared statements that finalize themselves and
// check every return code.  A failed call throws cb::Error naming the
// database, what failed and SQLite's message; kFormat when the file is not
// a database or is damaged, kIo otherwise (busy, full disk, read-only...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "platform/error.h"

struct sqlite3;
struct sqlite3_stmt;

namespace cb::sqlite {

// The ErrorCode for a SQLite result code.
ErrorCode error_code(int rc);

// Throws cb::Error: "<db_label>: <what>: <SQLite's message for db>".
[[noreturn]] void fail(sqlite3* db, int rc, const std::string& db_label, std::string_view what);

// Runs `sql` (any number of statements, no results); throws on failure.
void exec(sqlite3* db, const char* sql, const std::string& db_label);

// The first read of a database just opened.  Throws cb::Error(kFormat) when
// its file is not one this SQLite can use: not a database, or a damaged
// header ("unsupported file format", which SQLite reports as a plain SQL
// error); other failures as fail().
void check_readable(sqlite3* db, const std::string& db_label);

// Throws cb::Error(kFormat) for damage a later query would meet: pages or
// SQL indexes that SQLite's integrity_check finds wrong (quick_check does
// not compare an index with its table), or tables and indexes other than
// those `schema` (its CREATE statements) makes in an empty database,
// comments and white space in their SQL aside (a renamed column in the
// stored schema text).
void check_intact(sqlite3* db, const char* schema, const std::string& db_label);

// True when `rc` says the database cannot be written here (a full disk, a
// read-only file system or file, no permission, an I/O error creating the
// -wal or -shm), so that reading it read-only may still work.
bool cannot_write(int rc);

// An existing database opened without writing anything, checked by one read.
// First read-only (committed transactions still in a -wal are seen; SQLite
// must be able to open or create the -shm), then, when even that fails (a
// full disk, a read-only directory without a -shm), as an immutable file:
// read without locks and without the -wal, so transactions still in a -wal
// are not seen and another process must not write meanwhile.  *immutable
// says which.  Throws cb::Error (fail()) when neither can read it.
sqlite3* open_read_only(const std::string& path, const std::string& db_label, bool* immutable);

class Statement {
 public:
  // Prepares `sql` on `db`; `db_label` names the database in errors.
  Statement(sqlite3* db, const char* sql, std::string db_label);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& operator=(Statement&&) = delete;

  // Parameters are numbered from 1.  Text and blobs are copied.
  Statement& bind(int i, int64_t v);
  Statement& bind(int i, std::string_view text);
  Statement& bind_u64(int i, uint64_t v);  // stored as the same 64 bits, signed
  Statement& bind_double(int i, double v);
  // A zero-length blob is still a blob (not NULL), so it compares equal.
  Statement& bind_blob(int i, const void* data, size_t n);
  Statement& bind_blob(int i, std::string_view bytes) {
    return bind_blob(i, bytes.data(), bytes.size());
  }

  // True while a row is available; false when the statement is done.
  bool step();

  // Columns of the current row, numbered from 0.
  int64_t i64(int col) const;
  uint64_t u64(int col) const;
  double real(int col) const;
  std::string text(int col) const;
  std::string blob(int col) const;

 private:
  Statement& check(int rc, std::string_view what);

  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string db_label_;
};

}  // namespace cb::sqlite
