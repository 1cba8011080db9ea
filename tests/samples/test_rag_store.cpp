// rag_assistant's corpus store without a model: the KV settings, schema
// upgrades of older stores, the models with KV and remove's arguments.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app.h"
#include "corpus_db.h"
#include "kv_store.h"
#include "manage.h"

// The store's KV settings survive a reopen, and values this version does not
// understand (a newer tool's, a hand edit) fall back to the defaults.
TEST(KvSettings, RoundTripAndUnknownValues) {
  const std::string dir = ::testing::TempDir() + "kv_settings_" + std::to_string(::getpid());
  const std::string path = dir + "/corpus.sqlite";
  {
    rag::CorpusDb db(path, true);
    const rag::KvStoreSettings fresh = rag::load_kv_settings(db);
    EXPECT_EQ(fresh.codec, rag::KvStoreSettings::kDefaultCodec);
    EXPECT_EQ(fresh.capacity_bytes, rag::KvStoreSettings::kDefaultCapacityBytes);
    rag::KvStoreSettings s;
    s.codec = CB_CODEC_Q4;
    s.capacity_bytes = uint64_t{123} << 20;
    rag::save_kv_settings(db, s);
  }
  {
    rag::CorpusDb db(path, false);
    const rag::KvStoreSettings s = rag::load_kv_settings(db);
    EXPECT_EQ(s.codec, CB_CODEC_Q4);
    EXPECT_EQ(s.capacity_bytes, uint64_t{123} << 20);
    db.set_setting("kv_codec", "q3");
    db.set_setting("kv_capacity_bytes", "lots");
    const rag::KvStoreSettings odd = rag::load_kv_settings(db);
    EXPECT_EQ(odd.codec, rag::KvStoreSettings::kDefaultCodec);
    EXPECT_EQ(odd.capacity_bytes, rag::KvStoreSettings::kDefaultCapacityBytes);
  }
  std::filesystem::remove_all(dir);
}

TEST(KvSettings, ParsesWhenAndCodecNames) {
  EXPECT_EQ(rag::parse_kv_when("lazy"), rag::KvWhen::kLazy);
  EXPECT_EQ(rag::parse_kv_when("background"), rag::KvWhen::kBackground);
  EXPECT_FALSE(rag::parse_kv_when("Eager"));
  for (cb_codec c : {CB_CODEC_F16, CB_CODEC_Q8, CB_CODEC_Q4})
    EXPECT_EQ(rag::parse_codec(rag::codec_name(c)), c);
  EXPECT_FALSE(rag::parse_codec(""));
}

namespace {

namespace fs = std::filesystem;

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  TempDir() {
    path = fs::temp_directory_path() /
           ("rag_units_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
  static inline int counter = 0;
};

void exec_sql(sqlite3* db, const char* sql) {
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
}

// A corpus database as the first versions wrote it: no user_version, no
// kv_models; `with_settings`: the settings table of the versions that
// recorded the chunk length.
void write_old_store(const std::string& path, bool with_settings) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  exec_sql(db,
           "CREATE TABLE files(id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL,"
           " display TEXT NOT NULL, hash TEXT NOT NULL, title TEXT NOT NULL);"
           "CREATE TABLE chunks(id INTEGER PRIMARY KEY,"
           " file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,"
           " idx INTEGER NOT NULL, text TEXT NOT NULL, n_tokens INTEGER NOT NULL,"
           " UNIQUE(file_id, idx));"
           "CREATE VIRTUAL TABLE chunks_fts USING fts5(title, text, tokenize='porter unicode61');"
           "INSERT INTO files VALUES (1, '/docs/cats.md', 'docs/cats.md', 'abc', 'Cats');"
           "INSERT INTO chunks VALUES (1, 1, 0, 'The office cat is named Mochi.', 9);"
           "INSERT INTO chunks VALUES (2, 1, 1, 'Mochi sleeps on the printer.', 7);"
           "INSERT INTO chunks_fts(rowid, title, text) VALUES"
           " (1, 'Cats', 'The office cat is named Mochi.'),"
           " (2, 'Cats', 'Mochi sleeps on the printer.');");
  if (with_settings)
    exec_sql(db,
             "CREATE TABLE settings(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
             "INSERT INTO settings VALUES ('chunk_tokens', '64');");
  sqlite3_close(db);
}

rag::ModelRecord model_record(const std::string& fingerprint, const std::string& name, int64_t t) {
  return {fingerprint, name, 1000, name + " (llama, 2 layers, 64 wide)", t};
}

}  // namespace

// Opening a store of the first schema upgrades it in place: its files,
// chunks, index and chunk length are kept, the new settings read as unset.
TEST(CorpusDbUpgrade, KeepsAnOldStoresDocumentsAndSettings) {
  for (const bool create : {false, true}) {
    TempDir dir;
    const std::string path = (dir.path / "corpus.sqlite").string();
    write_old_store(path, true);
    {
      rag::CorpusDb db(path, create);
      EXPECT_EQ(db.schema_version(), rag::CorpusDb::kSchemaVersion);
      ASSERT_EQ(db.files().size(), 1u);
      EXPECT_EQ(db.files()[0].display, "docs/cats.md");
      EXPECT_EQ(db.n_chunks(), 2);
      EXPECT_EQ(db.chunk_tokens(), std::optional<size_t>(64));
      EXPECT_FALSE(db.system_prompt().has_value());
      EXPECT_TRUE(db.kv_models().empty());
      const auto hits = db.search(rag::fts_match_query("printer"), 3);
      ASSERT_EQ(hits.size(), 1u);
      EXPECT_EQ(hits[0].index, 1);
      const auto summaries = db.file_summaries();
      ASSERT_EQ(summaries.size(), 1u);
      EXPECT_EQ(summaries[0].n_chunks, 2);
      EXPECT_EQ(summaries[0].n_tokens, 16);
      EXPECT_EQ(summaries[0].title, "Cats");
      db.set_system_prompt("Be brief.");
      db.record_kv_model(model_record("fp-a", "a.gguf", 100), false);
    }
    // What the upgraded store records survives a reopen, and a second
    // open changes nothing.
    rag::CorpusDb again(path, false);
    EXPECT_EQ(again.schema_version(), rag::CorpusDb::kSchemaVersion);
    EXPECT_EQ(again.system_prompt(), std::optional<std::string>("Be brief."));
    EXPECT_EQ(again.chunk_tokens(), std::optional<size_t>(64));
    ASSERT_EQ(again.kv_models().size(), 1u);
    EXPECT_EQ(again.kv_models()[0].file_name, "a.gguf");
    EXPECT_EQ(again.kv_models()[0].file_size, 1000u);
    EXPECT_EQ(again.files().size(), 1u);
  }
}

// The versions before the settings table: it is created, empty.
TEST(CorpusDbUpgrade, AddsTheSettingsTableToAStoreWithout) {
  TempDir dir;
  const std::string path = (dir.path / "corpus.sqlite").string();
  write_old_store(path, false);
  rag::CorpusDb db(path, false);
  EXPECT_EQ(db.schema_version(), rag::CorpusDb::kSchemaVersion);
  EXPECT_FALSE(db.chunk_tokens().has_value());
  db.set_chunk_tokens(128);
  EXPECT_EQ(db.chunk_tokens(), std::optional<size_t>(128));
  EXPECT_EQ(db.n_chunks(), 2);
}

// The models with KV: newest first, refreshed in place, and only_this
// forgets the others (a re-chunk or a new system prompt).
TEST(CorpusDbModels, NewestFirstAndOnlyThis) {
  TempDir dir;
  rag::CorpusDb db((dir.path / "corpus.sqlite").string(), true);
  db.record_kv_model(model_record("fp-a", "a.gguf", 100), false);
  db.record_kv_model(model_record("fp-b", "b.gguf", 200), false);
  auto models = db.kv_models();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].file_name, "b.gguf");
  EXPECT_EQ(models[1].file_name, "a.gguf");
  db.record_kv_model(model_record("fp-a", "a.gguf", 300), false);
  models = db.kv_models();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].file_name, "a.gguf");
  EXPECT_EQ(models[0].ingested_at, 300);
  db.record_kv_model(model_record("fp-b", "b.gguf", 400), true);
  models = db.kv_models();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].fingerprint, "fp-b");
}

// remove's arguments: a path (also of a file deleted since), a folder, a
// display name; unknown and ambiguous names are errors that remove nothing.
TEST(ResolveStoredFiles, PathsFoldersAndNames) {
  TempDir dir;
  const fs::path docs = fs::canonical(dir.path) / "docs";
  fs::create_directories(docs / "sub");
  for (const char* name : {"a.md", "sub/b.md"}) std::ofstream(docs / name) << "text\n";
  const std::vector<rag::FileRecord> stored = {
      {1, (docs / "a.md").string(), "docs/a.md", "h1"},
      {2, (docs / "sub/b.md").string(), "docs/sub/b.md", "h2"},
      {3, (docs / "gone.md").string(), "notes.md", "h3"},  // deleted since it was ingested
      {4, "/elsewhere/notes.md", "notes.md", "h4"},
  };
  auto ids = [&](const std::vector<std::string>& args) {
    std::vector<int64_t> out;
    for (const rag::FileRecord& f : rag::resolve_stored_files(stored, args)) out.push_back(f.id);
    return out;
  };
  EXPECT_EQ(ids({(docs / "a.md").string()}), std::vector<int64_t>{1});
  // A relative path and one through "..", as ingest resolves them.
  const fs::path cwd = fs::current_path();
  fs::current_path(docs / "sub");
  EXPECT_EQ(ids({"../a.md", "b.md"}), (std::vector<int64_t>{1, 2}));
  fs::current_path(cwd);
  EXPECT_EQ(ids({(docs / "gone.md").string()}), std::vector<int64_t>{3});
  EXPECT_EQ(ids({(docs / "sub").string()}), std::vector<int64_t>{2});
  EXPECT_EQ(ids({docs.string(), "docs/a.md"}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ids({"docs/sub/b.md"}), std::vector<int64_t>{2});
  try {
    rag::resolve_stored_files(stored, {"docs/a.md", "missing.md", "docs/nope"});
    FAIL() << "unknown names must throw";
  } catch (const rag::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("missing.md, docs/nope"), std::string::npos) << what;
    EXPECT_NE(what.find("nothing was removed"), std::string::npos) << what;
  }
  EXPECT_THROW(rag::resolve_stored_files(stored, {"notes.md"}), rag::Error);
}
