#include "corpus_db.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "error.h"
#include "platform/sqlite.h"

namespace rag {
namespace {

// Common English words that say nothing about which chunk is relevant; as
// OR terms they would rank every chunk, and as question terms they would
// weigh in its relevance (retrieval.h).
const std::set<std::string, std::less<>> kStopwords = {
    "a",        "about",    "after",      "all",     "also",  "am",         "an",    "and",
    "any",      "anything", "are",        "as",      "at",    "be",         "been",  "being",
    "both",     "but",      "by",         "can",     "could", "did",        "do",    "does",
    "each",     "every",    "everything", "for",     "from",  "had",        "has",   "have",
    "he",       "her",      "here",       "herself", "him",   "himself",    "his",   "how",
    "i",        "if",       "in",         "into",    "is",    "it",         "its",   "itself",
    "just",     "me",       "more",       "most",    "my",    "myself",     "no",    "not",
    "nothing",  "of",       "on",         "only",    "or",    "other",      "our",   "ourselves",
    "same",     "she",      "should",     "so",      "some",  "something",  "such",  "tell",
    "than",     "that",     "the",        "their",   "them",  "themselves", "then",  "there",
    "these",    "they",     "this",       "those",   "to",    "too",        "us",    "very",
    "was",      "we",       "were",       "what",    "when",  "where",      "which", "who",
    "whom",     "whose",    "why",        "will",    "with",  "would",      "you",   "your",
    "yourself",
};

// Names the database in SQLite errors.
constexpr const char kDbLabel[] = "corpus database";

}  // namespace

namespace {

// The question's distinct words, lowercased, and those of them that are not
// stopwords.
void split_question(std::string_view question, std::vector<std::string>& words,
                    std::vector<std::string>& content) {
  std::string w;
  auto flush = [&] {
    if (w.empty()) return;
    if (std::find(words.begin(), words.end(), w) == words.end()) {
      words.push_back(w);
      if (!kStopwords.count(w)) content.push_back(w);
    }
    w.clear();
  };
  for (char ch : question) {
    const auto c = static_cast<unsigned char>(ch);
    // Letters and digits, and any non-ASCII byte (UTF-8 letters of other
    // scripts); everything else separates words.
    if (std::isalnum(c) || c >= 0x80)
      w += static_cast<char>(std::tolower(c));
    else
      flush();
  }
  flush();
}

// A word as an FTS5 string: searched for as text, never as syntax.  Words
// hold no '"' (split_question splits at it).
std::string fts_string(const std::string& word) {
  return '"' + word + '"';
}

}  // namespace

std::vector<std::string> content_words(std::string_view question) {
  std::vector<std::string> words, content;
  split_question(question, words, content);
  return content;
}

std::string fts_match_query(std::string_view question) {
  std::vector<std::string> words, content;
  split_question(question, words, content);
  const std::vector<std::string>& terms = content.empty() ? words : content;
  std::string q;
  for (const std::string& t : terms) {
    if (!q.empty()) q += " OR ";
    q += fts_string(t);
  }
  return q;
}

CorpusDb::CorpusDb(const std::string& path, bool create) : path_(path) {
  if (create) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    if (ec) throw Error("cannot create the store directory for " + path + ": " + ec.message());
  } else if (!std::filesystem::exists(path)) {
    throw Error("no corpus in this store (" + path +
                " does not exist): run 'rag_assistant --store DIR ingest PATH...' first");
  }
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error("cannot open the corpus database " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db_, 5000);
  if (const int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
      rc != SQLITE_OK) {
    const std::string why = sqlite3_errmsg(db_);
    sqlite3_close(db_);
    db_ = nullptr;
    // Answering needs no writes: a full disk or a read-only store is read
    // as it is.
    if (create || !cb::sqlite::cannot_write(rc))
      throw Error("cannot open the corpus database " + path + ": " + why);
    bool immutable = false;
    try {
      db_ = cb::sqlite::open_read_only(path, kDbLabel, &immutable);
    } catch (const cb::Error&) {
      throw Error("cannot open the corpus database " + path + ": " + why);
    }
    sqlite3_busy_timeout(db_, 5000);
    read_only_note_ =
        "the corpus database " + path + " cannot be written (" + why + "): opened read-only" +
        (immutable ? " as it was last closed (changes still in its -wal are not seen)" : "");
  } else if (!create && sqlite3_db_readonly(db_, "main") == 1) {
    // SQLite opened a file it may not write read-only by itself.
    read_only_note_ = "the corpus database " + path +
                      " cannot be written (no write permission or a read-only file system): "
                      "opened read-only";
  }
  exec("PRAGMA foreign_keys=ON");
  if (create) {
    exec(
        "CREATE TABLE IF NOT EXISTS files("
        " id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, display TEXT NOT NULL,"
        " hash TEXT NOT NULL, title TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS chunks("
        " id INTEGER PRIMARY KEY,"
        " file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,"
        " idx INTEGER NOT NULL, text TEXT NOT NULL, n_tokens INTEGER NOT NULL,"
        " UNIQUE(file_id, idx));"
        // The index keeps its own copy of title and text: simpler than an
        // external-content table kept in sync by triggers, and a corpus of
        // text is small next to its KV.  Porter stemming lets "leads"
        // find "lead".
        "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5("
        " title, text, tokenize='porter unicode61');"
        "CREATE TABLE IF NOT EXISTS settings(key TEXT PRIMARY KEY, value TEXT NOT NULL);");
  } else {
    // An existing file that is not our database says so plainly.
    cb::sqlite::Statement s(
        db_, "SELECT count(*) FROM sqlite_master WHERE name IN ('files','chunks','chunks_fts')",
        kDbLabel);
    if (!s.step() || s.i64(0) != 3)
      throw Error(path + " is not a rag_assistant corpus (run ingest into a new store)");
  }
  // A store opened read-only stays as it is: the readers below take a
  // missing table as empty.
  if (read_only_note_.empty()) upgrade_schema();
}

bool CorpusDb::has_table(const char* name) {
  cb::sqlite::Statement s(
      db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1", kDbLabel);
  s.bind(1, std::string_view(name));
  return s.step() && s.i64(0) > 0;
}

int CorpusDb::schema_version() {
  cb::sqlite::Statement s(db_, "PRAGMA user_version", kDbLabel);
  return s.step() ? static_cast<int>(s.i64(0)) : 0;
}

void CorpusDb::upgrade_schema() {
  if (schema_version() >= kSchemaVersion) return;
  // Version 0 (no user_version) had files, chunks, chunks_fts and, from
  // some point on, settings.  Version 1 adds kv_models.  Tables are only
  // ever added, so the files, chunks and settings are kept as they are.
  exec("BEGIN IMMEDIATE");
  try {
    exec(
        "CREATE TABLE IF NOT EXISTS settings(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS kv_models("
        " fingerprint TEXT PRIMARY KEY, file_name TEXT NOT NULL, file_size INTEGER NOT NULL,"
        " description TEXT NOT NULL, ingested_at INTEGER NOT NULL);"
        "PRAGMA user_version = 1");
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

CorpusDb::~CorpusDb() {
  sqlite3_close(db_);
}

void CorpusDb::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    throw Error("corpus database " + path_ + ": " + msg);
  }
}

std::optional<FileRecord> CorpusDb::find_file(const std::string& path) {
  cb::sqlite::Statement s(db_, "SELECT id, path, display, hash FROM files WHERE path = ?1",
                          kDbLabel);
  s.bind(1, path);
  if (!s.step()) return std::nullopt;
  return FileRecord{s.i64(0), s.text(1), s.text(2), s.text(3)};
}

std::vector<FileRecord> CorpusDb::files() {
  cb::sqlite::Statement s(db_, "SELECT id, path, display, hash FROM files ORDER BY id", kDbLabel);
  std::vector<FileRecord> out;
  while (s.step()) out.push_back({s.i64(0), s.text(1), s.text(2), s.text(3)});
  return out;
}

void CorpusDb::replace_file(const FileRecord& file, const std::string& title,
                            const std::vector<std::pair<std::string, int>>& chunks) {
  exec("BEGIN IMMEDIATE");
  try {
    if (auto old = find_file(file.path)) remove_file(old->id);
    cb::sqlite::Statement ins(
        db_, "INSERT INTO files(path, display, hash, title) VALUES (?1, ?2, ?3, ?4)", kDbLabel);
    ins.bind(1, file.path).bind(2, file.display).bind(3, file.hash).bind(4, title);
    ins.step();
    const int64_t file_id = sqlite3_last_insert_rowid(db_);
    for (size_t i = 0; i < chunks.size(); ++i) {
      cb::sqlite::Statement c(
          db_, "INSERT INTO chunks(file_id, idx, text, n_tokens) VALUES (?1, ?2, ?3, ?4)",
          kDbLabel);
      c.bind(1, file_id)
          .bind(2, static_cast<int64_t>(i))
          .bind(3, chunks[i].first)
          .bind(4, static_cast<int64_t>(chunks[i].second));
      c.step();
      const int64_t chunk_id = sqlite3_last_insert_rowid(db_);
      cb::sqlite::Statement f(db_, "INSERT INTO chunks_fts(rowid, title, text) VALUES (?1, ?2, ?3)",
                              kDbLabel);
      f.bind(1, chunk_id).bind(2, title).bind(3, chunks[i].first);
      f.step();
    }
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void CorpusDb::remove_file(int64_t file_id) {
  cb::sqlite::Statement f(
      db_, "DELETE FROM chunks_fts WHERE rowid IN (SELECT id FROM chunks WHERE file_id = ?1)",
      kDbLabel);
  f.bind(1, file_id);
  f.step();
  cb::sqlite::Statement d(db_, "DELETE FROM files WHERE id = ?1",
                          kDbLabel);  // chunks go by ON DELETE CASCADE
  d.bind(1, file_id);
  d.step();
}

std::optional<std::string> CorpusDb::setting(const std::string& key) {
  if (!has_table("settings")) return std::nullopt;  // a store opened read-only before an upgrade
  cb::sqlite::Statement s(db_, "SELECT value FROM settings WHERE key = ?1", kDbLabel);
  s.bind(1, key);
  if (!s.step()) return std::nullopt;
  return s.text(0);
}

void CorpusDb::set_setting(const std::string& key, const std::string& value) {
  cb::sqlite::Statement s(db_, "INSERT OR REPLACE INTO settings(key, value) VALUES (?1, ?2)",
                          kDbLabel);
  s.bind(1, key);
  s.bind(2, value);
  s.step();
}

std::optional<size_t> CorpusDb::chunk_tokens() {
  const std::optional<std::string> v = setting("chunk_tokens");
  if (!v) return std::nullopt;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || n == 0) return std::nullopt;  // not ours: ignored
  return static_cast<size_t>(n);
}

void CorpusDb::set_chunk_tokens(size_t n) {
  set_setting("chunk_tokens", std::to_string(n));
}

std::optional<std::string> CorpusDb::system_prompt() {
  return setting("system_prompt");
}

void CorpusDb::set_system_prompt(const std::string& text) {
  set_setting("system_prompt", text);
}

std::vector<ModelRecord> CorpusDb::kv_models() {
  if (!has_table("kv_models")) return {};
  cb::sqlite::Statement s(db_,
                          "SELECT fingerprint, file_name, file_size, description, ingested_at"
                          " FROM kv_models ORDER BY ingested_at DESC, rowid DESC",
                          kDbLabel);
  std::vector<ModelRecord> out;
  while (s.step()) out.push_back({s.text(0), s.text(1), s.u64(2), s.text(3), s.i64(4)});
  return out;
}

void CorpusDb::record_kv_model(const ModelRecord& model, bool only_this) {
  exec("BEGIN IMMEDIATE");
  try {
    if (only_this) {
      cb::sqlite::Statement d(db_, "DELETE FROM kv_models WHERE fingerprint <> ?1", kDbLabel);
      d.bind(1, model.fingerprint);
      d.step();
    }
    cb::sqlite::Statement s(db_,
                            "INSERT OR REPLACE INTO kv_models(fingerprint, file_name, file_size,"
                            " description, ingested_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                            kDbLabel);
    s.bind(1, model.fingerprint)
        .bind(2, model.file_name)
        .bind_u64(3, model.file_size)
        .bind(4, model.description)
        .bind(5, model.ingested_at);
    s.step();
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

std::vector<FileSummary> CorpusDb::file_summaries() {
  cb::sqlite::Statement s(db_,
                          "SELECT f.id, f.path, f.display, f.hash, f.title, count(c.id),"
                          " coalesce(sum(c.n_tokens), 0)"
                          " FROM files f LEFT JOIN chunks c ON c.file_id = f.id"
                          " GROUP BY f.id ORDER BY f.id",
                          kDbLabel);
  std::vector<FileSummary> out;
  while (s.step())
    out.push_back({{s.i64(0), s.text(1), s.text(2), s.text(3)}, s.text(4), s.i64(5), s.i64(6)});
  return out;
}

void CorpusDb::remove_files(const std::vector<int64_t>& file_ids) {
  exec("BEGIN IMMEDIATE");
  try {
    for (int64_t id : file_ids) remove_file(id);
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

std::vector<std::string> CorpusDb::chunk_texts(int64_t file_id) {
  cb::sqlite::Statement s(db_, "SELECT text FROM chunks WHERE file_id = ?1 ORDER BY idx", kDbLabel);
  s.bind(1, file_id);
  std::vector<std::string> out;
  while (s.step()) out.push_back(s.text(0));
  return out;
}

int64_t CorpusDb::n_chunks() {
  cb::sqlite::Statement s(db_, "SELECT count(*) FROM chunks", kDbLabel);
  s.step();
  return s.i64(0);
}

std::vector<ChunkRecord> CorpusDb::all_chunks() {
  cb::sqlite::Statement s(
      db_,
      "SELECT c.id, c.file_id, c.idx, f.title, c.text, c.n_tokens, f.display, f.path"
      " FROM chunks c JOIN files f ON f.id = c.file_id ORDER BY c.id",
      kDbLabel);
  std::vector<ChunkRecord> out;
  while (s.step())
    out.push_back({s.i64(0), s.i64(1), static_cast<int>(s.i64(2)), s.text(3), s.text(4),
                   static_cast<int>(s.i64(5)), s.text(6), 0.0, s.text(7)});
  return out;
}

std::vector<ChunkRecord> CorpusDb::search(const std::string& match, int k) {
  if (match.empty()) return {};
  // Title matches weigh double: a file named for a topic is about it.
  cb::sqlite::Statement s(db_,
                          "SELECT c.id, c.file_id, c.idx, f.title, c.text, c.n_tokens, f.display,"
                          " bm25(chunks_fts, 2.0, 1.0) AS score, f.path"
                          " FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid"
                          " JOIN files f ON f.id = c.file_id"
                          " WHERE chunks_fts MATCH ?1 ORDER BY score LIMIT ?2",
                          kDbLabel);
  s.bind(1, match).bind(2, static_cast<int64_t>(k));
  std::vector<ChunkRecord> out;
  while (s.step())
    out.push_back({s.i64(0), s.i64(1), static_cast<int>(s.i64(2)), s.text(3), s.text(4),
                   static_cast<int>(s.i64(5)), s.text(6), s.real(7), s.text(8)});
  return out;
}

std::vector<std::string> CorpusDb::index_terms(const std::vector<std::string>& words) {
  if (!have_term_tables_) {
    // In the connection's temp schema, which a read-only store may write
    // too: the words go through the very tokenizer the index used, and
    // fts5vocab reads back what it made of each.
    exec(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.question_words USING fts5("
        " word, tokenize='porter unicode61');"
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.question_terms USING fts5vocab("
        " temp, question_words, instance);");
    have_term_tables_ = true;
  }
  exec("DELETE FROM temp.question_words");
  for (size_t i = 0; i < words.size(); ++i) {
    cb::sqlite::Statement ins(db_, "INSERT INTO temp.question_words(rowid, word) VALUES (?1, ?2)",
                              kDbLabel);
    ins.bind(1, static_cast<int64_t>(i)).bind(2, words[i]);
    ins.step();
  }
  std::vector<std::string> terms(words.size());
  cb::sqlite::Statement s(db_, "SELECT doc, term FROM temp.question_terms ORDER BY doc, \"offset\"",
                          kDbLabel);
  while (s.step()) {
    const int64_t i = s.i64(0);
    if (i < 0 || static_cast<size_t>(i) >= terms.size()) continue;
    std::string& t = terms[static_cast<size_t>(i)];
    if (!t.empty()) t += ' ';
    t += s.text(1);
  }
  return terms;
}

int64_t CorpusDb::chunks_with_word(const std::string& word) {
  cb::sqlite::Statement s(db_, "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?1",
                          kDbLabel);
  s.bind(1, fts_string(word));
  s.step();
  return s.i64(0);
}

std::vector<int64_t> CorpusDb::chunks_with_word_among(const std::string& word,
                                                      const std::vector<int64_t>& chunk_ids) {
  if (chunk_ids.empty()) return {};
  // The ids are integers of our own: written into the statement, they
  // need no binding.
  std::string ids;
  for (int64_t id : chunk_ids) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  const std::string sql =
      "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?1 AND rowid IN (" + ids + ")";
  cb::sqlite::Statement s(db_, sql.c_str(), kDbLabel);
  s.bind(1, fts_string(word));
  std::vector<int64_t> out;
  while (s.step()) out.push_back(s.i64(0));
  return out;
}

}  // namespace rag
