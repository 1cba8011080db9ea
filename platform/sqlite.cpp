#include "platform/sqlite.h"

#include <sqlite3.h>

#include <cctype>
#include <cstring>
#include <utility>

namespace cb::sqlite {

ErrorCode error_code(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB ? ErrorCode::kFormat
                                                               : ErrorCode::kIo;
}

void fail(sqlite3* db, int rc, const std::string& db_label, std::string_view what) {
  const char* why = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  cb::fail(error_code(rc), db_label + ": " + std::string(what) + ": " + why);
}

void exec(sqlite3* db, const char* sql, const std::string& db_label) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return;
  const std::string why = err != nullptr ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  cb::fail(error_code(rc), db_label + ": " + sql + ": " + why);
}

void check_readable(sqlite3* db, const std::string& db_label) {
  const int rc = sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);
  if (rc == SQLITE_ERROR)
    cb::fail(ErrorCode::kFormat, db_label + ": damaged: " + sqlite3_errmsg(db));
  if (rc != SQLITE_OK) fail(db, rc, db_label, "first read");
}

namespace {

// The tables and indexes with their SQL as SQLite records them, less its
// comments and white space: a comment or layout change in a schema must not
// make the databases that earlier builds wrote look damaged.
std::string schema_of(sqlite3* db, const std::string& db_label) {
  std::string out;
  Statement s(db,
              "SELECT type, name, tbl_name, IFNULL(sql, '') FROM sqlite_master "
              "ORDER BY type, name",
              db_label);
  while (s.step()) {
    for (int c = 0; c < 3; ++c) out += s.text(c) + ' ';
    const std::string sql = s.text(3);
    for (size_t i = 0; i < sql.size(); ++i) {
      if (sql.compare(i, 2, "--") == 0) {
        i = sql.find('\n', i);
        if (i == std::string::npos) break;
      } else if (!std::isspace(static_cast<unsigned char>(sql[i]))) {
        out += sql[i];
      }
    }
    out += '\n';
  }
  return out;
}

}  // namespace

void check_intact(sqlite3* db, const char* schema, const std::string& db_label) {
  {
    Statement s(db, "PRAGMA integrity_check", db_label);
    if (!s.step() || s.text(0) != "ok") {
      cb::fail(ErrorCode::kFormat, db_label + ": damaged: integrity_check: " + s.text(0));
    }
  }
  sqlite3* empty = nullptr;
  if (sqlite3_open(":memory:", &empty) != SQLITE_OK) {
    sqlite3_close(empty);
    cb::fail(ErrorCode::kOutOfMemory, db_label + ": cannot open an in-memory database");
  }
  std::string expected;
  try {
    exec(empty, schema, db_label + " (its schema, in memory)");
    expected = schema_of(empty, db_label);
  } catch (...) {
    sqlite3_close(empty);
    throw;
  }
  sqlite3_close(empty);
  if (schema_of(db, db_label) != expected) {
    cb::fail(ErrorCode::kFormat,
             db_label + ": damaged: its tables are not the ones this build makes");
  }
}

bool cannot_write(int rc) {
  switch (rc & 0xff) {
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
      return true;
    default:
      return false;
  }
}

namespace {

// `path` as an SQLite URI with `query`: bytes other than unreserved ones
// and '/' are percent-encoded, so '?', '#' and '%' in a name stay literal.
std::string file_uri(const std::string& path, const char* query) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string uri = "file:";
  for (const char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || std::strchr("-._~/", c) != nullptr) {
      uri += ch;
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 15];
    }
  }
  return uri + "?" + query;
}

// Opens `uri` and reads the schema; SQLITE_OK or the failing result code,
// with *db open (the caller closes it) for sqlite3_errmsg.
int open_and_read(const std::string& uri, sqlite3** db) {
  int rc = sqlite3_open_v2(uri.c_str(), db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) return rc;
  sqlite3_extended_result_codes(*db, 1);
  return sqlite3_exec(*db, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);
}

}  // namespace

sqlite3* open_read_only(const std::string& path, const std::string& db_label, bool* immutable) {
  // A leading "//" would read as a URI authority.
  const std::string p = path.rfind("//", 0) == 0 ? path.substr(1) : path;
  sqlite3* db = nullptr;
  int rc = open_and_read(file_uri(p, "mode=ro"), &db);
  *immutable = false;
  if (rc != SQLITE_OK && cannot_write(rc)) {
    sqlite3_close(db);
    db = nullptr;
    rc = open_and_read(file_uri(p, "immutable=1"), &db);
    *immutable = true;
  }
  if (rc != SQLITE_OK) {
    const std::string why = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    cb::fail(error_code(rc), db_label + ": cannot open read-only: " + why);
  }
  return db;
}

Statement::Statement(sqlite3* db, const char* sql, std::string db_label)
    : db_(db), db_label_(std::move(db_label)) {
  const int rc = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    fail(db_, rc, db_label_, sql);
  }
}

Statement::~Statement() {
  sqlite3_finalize(stmt_);
}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_),
      stmt_(std::exchange(other.stmt_, nullptr)),
      db_label_(std::move(other.db_label_)) {}

Statement& Statement::check(int rc, std::string_view what) {
  if (rc != SQLITE_OK) fail(db_, rc, db_label_, what);
  return *this;
}

Statement& Statement::bind(int i, int64_t v) {
  return check(sqlite3_bind_int64(stmt_, i, v), "bind");
}

Statement& Statement::bind(int i, std::string_view text) {
  return check(
      sqlite3_bind_text64(stmt_, i, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8),
      "bind");
}

Statement& Statement::bind_u64(int i, uint64_t v) {
  int64_t s;
  std::memcpy(&s, &v, sizeof s);  // SQLite integers are signed; keep the bits
  return bind(i, s);
}

Statement& Statement::bind_double(int i, double v) {
  return check(sqlite3_bind_double(stmt_, i, v), "bind");
}

Statement& Statement::bind_blob(int i, const void* data, size_t n) {
  static const char kEmpty = 0;
  return check(sqlite3_bind_blob64(stmt_, i, n != 0 ? data : &kEmpty, n, SQLITE_TRANSIENT), "bind");
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  fail(db_, rc, db_label_, sqlite3_sql(stmt_));
}

int64_t Statement::i64(int col) const {
  return sqlite3_column_int64(stmt_, col);
}

uint64_t Statement::u64(int col) const {
  const int64_t s = i64(col);
  uint64_t u;
  std::memcpy(&u, &s, sizeof u);
  return u;
}

double Statement::real(int col) const {
  return sqlite3_column_double(stmt_, col);
}

std::string Statement::text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p != nullptr ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
                      : std::string();
}

std::string Statement::blob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  const int n = sqlite3_column_bytes(stmt_, col);
  return p != nullptr ? std::string(static_cast<const char*>(p), static_cast<size_t>(n))
                      : std::string();
}

}  // namespace cb::sqlite
