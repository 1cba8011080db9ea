// libFuzzer target: any bytes as a question to rag_assistant's retrieval,
// over a small corpus database (the real schema, in a temporary directory)
// that also holds the question itself as a chunk.
//
// Input: a byte choosing top_k, the relevance floor and the per-file cap,
// then the question.  Checks what samples/rag_assistant/corpus_db.h and
// retrieval.h promise:
//   - fts_match_query quotes every word, so its MATCH expression is never
//     an FTS5 syntax error: search() on it does not throw;
//   - a question of ASCII text finds its own chunk (the words it searches
//     for are those the index holds);
//   - retrieve() does not throw, picks at most top_k chunks of the store,
//     with a relevance in [0, 1], and none when it finds no answer.
//
//   build-fuzz/bin/fuzz_retrieval -max_total_time=60
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "corpus_db.h"
#include "retrieval.h"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_retrieval: %s\n", what);
  std::abort();
}

// The corpus, made once per process in a directory removed at exit.
struct Corpus {
  std::filesystem::path dir;
  std::unique_ptr<rag::CorpusDb> db;
  rag::FileRecord question_file;

  Corpus() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fuzz_retrieval.XXXXXX").string();
    require(::mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary directory");
    dir = tmpl;
    db = std::make_unique<rag::CorpusDb>((dir / "corpus.sqlite").string(), true);
    db->replace_file({0, "/docs/office.md", "office.md", "h1"}, "Office",
                     {{"The office cat is named Mochi and sleeps by the printer.", 12},
                      {"Visitors sign in at the front desk before nine.", 10}});
    db->replace_file({0, "/docs/travel.md", "travel.md", "h2"}, "Travel",
                     {{"Meal allowance in Poland: 150 zloty a day; in the UK: 40 pounds.", 16}});
    question_file = {0, "/docs/question.txt", "question.txt", ""};
  }
  ~Corpus() {
    db.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

bool ascii_text(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Corpus corpus;
  if (size < 1) return 0;
  rag::RetrievalOptions opts;
  opts.top_k = 1 + data[0] % 6;
  opts.min_relevance = (data[0] & 0x40) ? 0.0 : rag::kDefaultMinRelevance;
  opts.diverse = (data[0] & 0x80) == 0;
  // The app reads a question as a C string (argv, a line of stdin).
  std::string question(reinterpret_cast<const char*>(data) + 1, size - 1);
  question.resize(std::min(question.find('\0'), question.size()));

  try {
    rag::CorpusDb& db = *corpus.db;
    corpus.question_file.hash = question;  // a new hash: the chunk is replaced
    db.replace_file(corpus.question_file, "Question", {{question, 1}});
    const std::string match = rag::fts_match_query(question);
    (void)rag::content_words(question);
    if (!match.empty()) {
      const std::vector<rag::ChunkRecord> hits = db.search(match, 50);
      if (ascii_text(question)) {
        const bool own = std::any_of(hits.begin(), hits.end(),
                                     [&](const rag::ChunkRecord& c) { return c.text == question; });
        require(own, "an ASCII question does not find its own chunk");
      }
    }
    const rag::Retrieval r = rag::retrieve(db, question, opts);
    require(static_cast<int>(r.chunks.size()) <= opts.top_k, "more chunks than top_k");
    require(r.relevance >= 0.0 && r.relevance <= 1.0 + 1e-9, "relevance outside [0, 1]");
    require(r.found || r.chunks.empty(), "chunks for a question not answered");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_retrieval: threw: %s\n", e.what());
    std::abort();
  }
  return 0;
}
