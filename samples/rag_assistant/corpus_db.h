// The document store: an SQLite database holding the ingested files, their
// chunks' text and an FTS5 full-text index over the chunks (BM25 ranking).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rag {

struct FileRecord {
  int64_t id = 0;
  std::string path;     // canonical absolute path: the file's identity
  std::string display;  // short name for reports (relative to what was ingested)
  std::string hash;     // content hash (and chunking settings)
};

struct ChunkRecord {
  int64_t id = 0;
  int64_t file_id = 0;
  int index = 0;  // position of the chunk in its file, from 0
  std::string title;
  std::string text;
  int n_tokens = 0;
  std::string display;  // of the file
  double score = 0.0;   // bm25 (lower is better) for search results
  std::string path;     // of the file (FileRecord::path)
  // The share of the question's terms the chunk holds, weighted by rarity
  // (retrieval.h); set by retrieve().
  double relevance = 0.0;
};

// A stored file with its chunk and token counts (for `list`).
struct FileSummary {
  FileRecord file;
  std::string title;
  int64_t n_chunks = 0;
  int64_t n_tokens = 0;
};

// A model whose chunk KV an ingest computed into the store.  The library
// keys chunk KV by a hash of the model's whole file; this identity is cheap
// to compute (model_identity() in app.h) and tells another model apart.
struct ModelRecord {
  std::string fingerprint;  // the file's size and a hash of its first and last bytes
  std::string file_name;    // without its directory
  uint64_t file_size = 0;   // bytes
  std::string description;  // what cb_model_get_info says (name, architecture, layers)
  int64_t ingested_at = 0;  // Unix seconds of its last ingest
};

// The FTS5 MATCH expression for a free-text question: its words, lowercased,
// stopwords dropped (all words kept when nothing else is left), each one
// quoted as an FTS5 string and ORed.  Quoting makes every input safe: FTS5
// syntax ("AND", '*', '-', quotes, parentheses) in the question is only
// ever searched for as text.  Empty when the question has no words.
std::string fts_match_query(std::string_view question);

// The question's words as fts_match_query finds them (lowercased, each
// once), stopwords dropped; empty when nothing else is left.
std::vector<std::string> content_words(std::string_view question);

class CorpusDb {
 public:
  // Opens DIR/corpus.sqlite.  create: make the directory and the database
  // when missing; otherwise a missing database is an Error that says to
  // ingest first.
  // create == false and the database cannot be written (a full disk, a
  // read-only store): it is opened read-only and read_only_note() says so.
  CorpusDb(const std::string& path, bool create);
  ~CorpusDb();
  CorpusDb(const CorpusDb&) = delete;
  CorpusDb& operator=(const CorpusDb&) = delete;

  std::optional<FileRecord> find_file(const std::string& path);
  std::vector<FileRecord> files();
  // Inserts or replaces the file's record and all of its chunks, atomically.
  void replace_file(const FileRecord& file, const std::string& title,
                    const std::vector<std::pair<std::string, int>>& chunks);
  void remove_file(int64_t file_id);

  // The chunk length the store was last ingested with (none before the
  // first ingest, or in a store from before it was recorded).
  std::optional<size_t> chunk_tokens();
  void set_chunk_tokens(size_t n);

  // The store's other settings (key -> text); none when never set.
  std::optional<std::string> setting(const std::string& key);
  void set_setting(const std::string& key, const std::string& value);

  // The system prompt the chunks' KV was computed with (none before it was
  // first recorded: the app's default applies).
  std::optional<std::string> system_prompt();
  void set_system_prompt(const std::string& text);

  // The models whose chunk KV an ingest computed, the most recent first.
  std::vector<ModelRecord> kv_models();
  // Records (or refreshes) `model` as having the store's KV.  only_this:
  // forget the others (their KV no longer matches the chunks or the system
  // prompt).
  void record_kv_model(const ModelRecord& model, bool only_this);

  // Every file with its chunk and token counts, in ingest order.
  std::vector<FileSummary> file_summaries();
  // Removes the files (and their chunks) in one transaction: all or none.
  void remove_files(const std::vector<int64_t>& file_ids);

  // The schema's version (PRAGMA user_version): an existing store is
  // upgraded to kSchemaVersion when it is opened writable.
  static constexpr int kSchemaVersion = 1;
  int schema_version();

  int64_t n_chunks();
  // The text of each of a file's chunks.
  std::vector<std::string> chunk_texts(int64_t file_id);
  // Every chunk (id order), for the KV precompute.
  std::vector<ChunkRecord> all_chunks();
  // The best `k` chunks for the MATCH expression (see fts_match_query), best
  // first.
  std::vector<ChunkRecord> search(const std::string& match, int k);

  // The terms the index's tokenizer (porter unicode61) makes of each word:
  // its stem, or several for a word it splits, joined by a space; empty
  // for a word it drops.  Words with the same stem get the same term.
  std::vector<std::string> index_terms(const std::vector<std::string>& words);
  // How many chunks hold the word (as the index stems it: "leads" counts
  // the chunks that say "lead").
  int64_t chunks_with_word(const std::string& word);
  // Those of `chunk_ids` that hold the word.
  std::vector<int64_t> chunks_with_word_among(const std::string& word,
                                              const std::vector<int64_t>& chunk_ids);

  // Why the database was opened read-only; empty when it is writable.
  const std::string& read_only_note() const { return read_only_note_; }

 private:
  void exec(const char* sql);
  // Creates what a store of an older schema lacks (its data kept).
  void upgrade_schema();
  bool has_table(const char* name);
  sqlite3* db_ = nullptr;
  bool have_term_tables_ = false;  // the temp tables index_terms() uses
  std::string path_;
  std::string read_only_note_;
};

}  // namespace rag
