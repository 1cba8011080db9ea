// rag_assistant's model-free parts: the chunker (driven by a word-counting
// stand-in for the tokenizer), the FTS5 query built from a question (run
// against a real FTS5 table, so any syntax error would show), the corpus
// database's schema upgrade of older stores and its record of models, and
// how remove's arguments name stored files.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app.h"
#include "chunker.h"
#include "corpus_db.h"
#include "manage.h"
#include "printable.h"

namespace {

// One "token" per whitespace-separated word; split() cuts between words.
class WordTokens final : public rag::TokenCounter {
 public:
  size_t count(std::string_view text) const override { return words(text).size(); }
  std::vector<std::string> split(std::string_view text, size_t max_tokens) const override {
    // Pieces of max_tokens words, each keeping the spaces before its next
    // word so that the concatenation is the text.
    std::vector<std::string> out;
    std::string cur;
    size_t n = 0, i = 0;
    while (i < text.size()) {
      const bool space = text[i] == ' ' || text[i] == '\n';
      if (!space && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
        if (n == max_tokens) {
          out.push_back(cur);
          cur.clear();
          n = 0;
        }
        ++n;
      }
      cur += text[i++];
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  }

 private:
  static std::vector<std::string> words(std::string_view s) {
    std::vector<std::string> w;
    std::string cur;
    for (char c : s) {
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
        if (!cur.empty()) w.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) w.push_back(cur);
    return w;
  }
};

std::string join_words(const std::vector<rag::Chunk>& chunks) {
  std::string all;
  for (const auto& c : chunks) {
    for (char ch : c.text) all += (ch == '\n' ? ' ' : ch);
    all += ' ';
  }
  // Collapse runs of spaces: chunking may only move whitespace.
  std::string out;
  for (char ch : all)
    if (ch != ' ' || (!out.empty() && out.back() != ' ')) out += ch;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

TEST(Chunker, KeepsParagraphsWholeAndPacksThem) {
  const WordTokens tok;
  const std::string text = "one two three\n\nfour five\n\nsix seven eight nine\n";
  const auto chunks = rag::chunk_text(text, 5, tok);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, "one two three\n\nfour five");
  EXPECT_EQ(chunks[0].n_tokens, 5u);
  EXPECT_EQ(chunks[1].text, "six seven eight nine");
}

TEST(Chunker, SplitsLongParagraphsAtSentencesThenWords) {
  const WordTokens tok;
  const std::string text = "A b c d. E f g h. I j k l m n o p q r s t.";
  const auto chunks = rag::chunk_text(text, 4, tok);
  ASSERT_GE(chunks.size(), 5u);
  EXPECT_EQ(chunks[0].text, "A b c d.");
  EXPECT_EQ(chunks[1].text, "E f g h.");
  for (const auto& c : chunks) EXPECT_LE(c.n_tokens, 4u) << c.text;
  EXPECT_EQ(join_words(chunks), "A b c d. E f g h. I j k l m n o p q r s t.");
}

// One "token" per character: a word longer than a chunk must be cut
// between tokens, the last resort.
class CharTokens final : public rag::TokenCounter {
 public:
  size_t count(std::string_view text) const override { return text.size(); }
  std::vector<std::string> split(std::string_view text, size_t max_tokens) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < text.size(); i += max_tokens)
      out.emplace_back(text.substr(i, max_tokens));
    return out;
  }
};

TEST(Chunker, CutsAnOverlongWordBetweenTokens) {
  const CharTokens tok;
  const auto chunks = rag::chunk_text("abcdefghij", 3, tok);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].text, "abc");
  EXPECT_EQ(chunks[3].text, "j");
}

TEST(Chunker, PacksWordsOfAnOverlongLine) {
  const WordTokens tok;
  std::string text;
  for (char d = '0'; d <= '9'; ++d) {
    text += 'w';
    text += d;
    text += ' ';
  }
  const auto chunks = rag::chunk_text(text, 3, tok);
  ASSERT_EQ(chunks.size(), 4u);
  for (const auto& c : chunks) EXPECT_LE(c.n_tokens, 3u);
  EXPECT_EQ(join_words(chunks), "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9");
}

TEST(Chunker, HeadingsStayWithTheTextAfterThem) {
  const WordTokens tok;
  const std::string text = "# Title\n\nalpha beta gamma\n\n## Section\n\ndelta epsilon zeta\n";
  const auto chunks = rag::chunk_text(text, 5, tok);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, "# Title\n\nalpha beta gamma");
  // The section's chunk carries the title it sits under.
  EXPECT_EQ(chunks[1].text, "# Title\n\n## Section\n\ndelta epsilon zeta");
}

// Each chunk says which sections it belongs to: the open headings, a
// sibling closing its predecessor, none from inside a code block.
TEST(Chunker, ChunksCarryTheirHeadingPath) {
  const WordTokens tok;
  const std::string text =
      "# Guide\n\nintro words\n\n## Offices\n\n### Oslo\n\n"
      "The office cat is a ginger tabby named Empanada. She sleeps on the printer. "
      "Visitors feed her at noon.\n\n### Bergen\n\nrainy city\n\n```\n# not a heading\n```\n\n"
      "more text after code\n";
  const auto chunks = rag::chunk_text(text, 12, tok);
  auto containing = [&](const std::string& words) -> std::string {
    for (const auto& c : chunks)
      if (c.text.find(words) != std::string::npos) return c.text;
    return "";
  };
  // Headings that open a chunk stay in its text; only those above are added.
  EXPECT_EQ(containing("Empanada").rfind("# Guide\n\n## Offices\n\n### Oslo\n\nThe office cat", 0),
            0u)
      << containing("Empanada");
  // A chunk cut from inside the Oslo section gets the whole path.
  EXPECT_EQ(containing("Visitors").rfind("# Guide\n## Offices\n### Oslo\n\n", 0), 0u)
      << containing("Visitors");
  EXPECT_EQ(containing("after code").rfind("# Guide\n## Offices\n### Bergen\n\n", 0), 0u)
      << containing("after code");
  EXPECT_EQ(containing("after code").find("not a heading"), std::string::npos);
  for (const auto& c : chunks) EXPECT_LE(c.n_tokens, 12u + 6u) << c.text;
}

TEST(Chunker, WhitespaceOnlyGivesNothing) {
  const WordTokens tok;
  EXPECT_TRUE(rag::chunk_text(" \n\n\t\n", 10, tok).empty());
  EXPECT_TRUE(rag::chunk_text("", 10, tok).empty());
}

TEST(FtsQuery, QuotesWordsDropsStopwordsAndOrsThem) {
  EXPECT_EQ(rag::fts_match_query("Which office does the leader of Project Heron work in?"),
            "\"office\" OR \"leader\" OR \"project\" OR \"heron\" OR \"work\"");
  // Only stopwords: they are all there is to search for.
  EXPECT_EQ(rag::fts_match_query("Who is it?"), "\"who\" OR \"is\" OR \"it\"");
  EXPECT_EQ(rag::fts_match_query("?? !! --"), "");
  EXPECT_EQ(rag::fts_match_query("cat cat CAT"), "\"cat\"");
}

// Every question, however hostile, is a valid MATCH expression.
TEST(FtsQuery, NeverASyntaxError) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61');"
                         "INSERT INTO t VALUES ('the office cat is named Mochi');",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  const char* questions[] = {
      "cat\" OR NEAR((", "AND OR NOT",           "* ^ - + : ( ) { }",  "name:Mochi",
      "\"unterminated",  "Ünïcödé café – 東京?", "NEAR(cat mochi, 2)", "a\x01\x02\xff b",
  };
  for (const char* q : questions) {
    const std::string match = rag::fts_match_query(q);
    if (match.empty()) continue;
    sqlite3_stmt* s = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT rowid FROM t WHERE t MATCH ?1", -1, &s, nullptr),
              SQLITE_OK);
    sqlite3_bind_text(s, 1, match.c_str(), -1, SQLITE_TRANSIENT);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    }
    EXPECT_EQ(rc, SQLITE_DONE) << q << " -> " << match << ": " << sqlite3_errmsg(db);
    sqlite3_finalize(s);
  }
  // And the words do find the row.
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM t WHERE t MATCH ?1", -1, &s, nullptr),
            SQLITE_OK);
  const std::string match = rag::fts_match_query("What is the cat NAMED?");
  sqlite3_bind_text(s, 1, match.c_str(), -1, SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 1);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

}  // namespace

// File names and GGUF metadata printed by the samples: control characters
// (C0, DEL, C1) and invalid UTF-8 become \xNN; valid UTF-8 stays.
TEST(Printable, EscapesControlsAndInvalidUtf8) {
  EXPECT_EQ(cbs::printable("plain name.md"), "plain name.md");
  EXPECT_EQ(cbs::printable("a\nb\tc\rd"), "a\\x0ab\\x09c\\x0dd");
  EXPECT_EQ(cbs::printable("\x1b[2Jx\x7f"), "\\x1b[2Jx\\x7f");
  EXPECT_EQ(cbs::printable("\xc2\x9b"
                           "31m"),
            "\\xc2\\x9b31m");  // C1 CSI
  EXPECT_EQ(cbs::printable("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(cbs::printable("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(cbs::printable(std::string_view("nul\0x", 5)), "nul\\x00x");
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
