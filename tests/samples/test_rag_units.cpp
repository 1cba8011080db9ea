// rag_assistant's model-free parts: the chunker (driven by a word-counting
// stand-in for the tokenizer), the FTS5 query built from a question (run
// against a real FTS5 table, so any syntax error would show), retrieval and
// its per-file diversity, printable names, pull's helpers and the model
// catalog.  Text extraction and the corpus store: test_rag_text_extract.cpp,
// test_rag_store.cpp.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "app.h"
#include "chunker.h"
#include "corpus_db.h"
#include "model_catalog.h"
#include "printable.h"
#include "pull.h"
#include "retrieval.h"
#include "word_tokens.h"

namespace {

using rag_test::WordTokens;

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

// A store in a fresh temporary directory, removed with the object.
class TempStore {
 public:
  TempStore() {
    dir_ = std::filesystem::temp_directory_path() /
           ("rag_units_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(dir_);
    db_ = std::make_unique<rag::CorpusDb>((dir_ / "corpus.sqlite").string(), true);
  }
  ~TempStore() {
    db_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A file of the given chunks (one token per word).
  void add(const std::string& name, const std::vector<std::string>& chunks) {
    std::vector<std::pair<std::string, int>> rows;
    for (const std::string& c : chunks) rows.emplace_back(c, 10);
    db_->replace_file({0, "/docs/" + name, name, "hash-" + name}, name, rows);
  }
  rag::CorpusDb& db() { return *db_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::unique_ptr<rag::CorpusDb> db_;
};

// Company notes where "office" is in every chunk: a common word.
void add_offices(TempStore& s) {
  s.add("osaka.md", {"The Osaka office runs the calibration lab. Its office cat Mochi sleeps on "
                     "the calibration bench."});
  s.add("tromso.md", {"The Tromso office is the headquarters, with the main workshop and a wind "
                      "tunnel for testing wind sensors in the office basement."});
  s.add("lisbon.md", {"The Lisbon office has a rooftop garden with lemon trees; field engineers "
                      "leave the office for customer trips."});
  s.add("meetings.md", {"The hardware review meets every Tuesday in the Fjord Room of the Tromso "
                        "office. Kenji chairs it."});
}

TEST(Retrieval, FloorAcceptsARelatedQuestion) {
  TempStore s;
  add_offices(s);
  const rag::Retrieval r = rag::retrieve(s.db(), "Where does the cat Mochi sleep?", {});
  ASSERT_TRUE(r.found);
  ASSERT_FALSE(r.chunks.empty());
  EXPECT_EQ(r.chunks.front().display, "osaka.md");
  // cat, mochi and sleep (as "sleeps") are all in that chunk.
  EXPECT_NEAR(r.relevance, 1.0, 1e-9);
  EXPECT_NEAR(r.chunks.front().relevance, 1.0, 1e-9);
}

TEST(Retrieval, FloorRefusesAQuestionMatchedOnlyByCommonWords) {
  TempStore s;
  add_offices(s);
  // "office" is in every chunk and "mongolia" in none: BM25 still ranks
  // chunks, but none is about the question.
  const rag::Retrieval r = rag::retrieve(s.db(), "Which office is in Mongolia?", {});
  EXPECT_FALSE(r.found);
  EXPECT_TRUE(r.chunks.empty());
  EXPECT_GT(r.relevance, 0.0);
  EXPECT_LT(r.relevance, 0.2);
  // With the floor off, the same question gets the chunks BM25 ranks.
  rag::RetrievalOptions off;
  off.min_relevance = 0.0;
  const rag::Retrieval any = rag::retrieve(s.db(), "Which office is in Mongolia?", off);
  EXPECT_TRUE(any.found);
  EXPECT_EQ(any.chunks.size(), 3u);
  EXPECT_DOUBLE_EQ(any.relevance, r.relevance);
}

TEST(Retrieval, NothingSharedIsNeverFound) {
  TempStore s;
  add_offices(s);
  rag::RetrievalOptions off;
  off.min_relevance = 0.0;
  for (const char* q : {"xylophone quasar zeppelin", "?? --"}) {
    const rag::Retrieval r = rag::retrieve(s.db(), q, off);
    EXPECT_FALSE(r.found) << q;
    EXPECT_TRUE(r.chunks.empty()) << q;
  }
  // Stopwords alone ("it" is in a chunk) are no content: relevance 0,
  // under any floor.
  const rag::Retrieval r = rag::retrieve(s.db(), "Who is it?", {});
  EXPECT_FALSE(r.found);
  EXPECT_EQ(r.relevance, 0.0);
}

TEST(Retrieval, RareTermsWeighMoreThanCommonOnes) {
  TempStore s;
  add_offices(s);
  // Holding the rare "lemon" beats holding "tromso" (two chunks) for a
  // question with both, and each share is below 1.
  rag::RetrievalOptions off;
  off.min_relevance = 0.0;
  off.top_k = 4;
  const rag::Retrieval r = rag::retrieve(s.db(), "lemon Tromso", off);
  std::map<std::string, double> by_file;
  for (const rag::ChunkRecord& c : r.chunks) by_file[c.display] = c.relevance;
  ASSERT_TRUE(by_file.count("lisbon.md") && by_file.count("tromso.md"));
  EXPECT_GT(by_file["lisbon.md"], by_file["tromso.md"]);
  EXPECT_NEAR(by_file["lisbon.md"] + by_file["tromso.md"], 1.0, 1e-9);
}

TEST(Retrieval, WordsOfOneStemCountOnce) {
  TempStore s;
  add_offices(s);
  EXPECT_EQ(s.db().index_terms({"sleeps", "sleep", "sleeping", "mochi", "the"}),
            (std::vector<std::string>{"sleep", "sleep", "sleep", "mochi", "the"}));
  // "chairs" and "chair" are one term the chunk holds; "lemon" is not.
  rag::RetrievalOptions off;
  off.min_relevance = 0.0;
  const rag::Retrieval r = rag::retrieve(s.db(), "chairs chair chairing Kenji lemon", off);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.chunks.front().display, "meetings.md");
  // chair and kenji of the three terms chair, kenji, lemon (each in one
  // chunk): 2/3, not the 4/5 of five separate words.
  EXPECT_NEAR(r.chunks.front().relevance, 2.0 / 3.0, 1e-9);
}

TEST(Retrieval, AQuestionOfTwoDocumentsIsCoveredByBoth) {
  TempStore s;
  s.add("people.md", {"Zofia Brandvold works in the Osaka office as a hardware engineer."});
  s.add("offices.md", {"The Osaka office has a grey cat named Mochi."});
  s.add("projects.md", {"Project Heron builds a solar powered rain gauge."});
  s.add("meetings.md", {"The hardware review is every Tuesday."});
  const char* q = "What is the name of the cat in the office where Zofia works?";
  const rag::Retrieval both = rag::retrieve(s.db(), q, {});
  ASSERT_TRUE(both.found);
  // name, cat, office, zofia, work: the two chunks together hold them all,
  // neither alone does.
  EXPECT_NEAR(both.relevance, 1.0, 1e-9);
  for (const rag::ChunkRecord& c : both.chunks) EXPECT_LT(c.relevance, 0.7) << c.display;
  rag::RetrievalOptions best_alone;
  best_alone.union_relevance = false;
  const rag::Retrieval one = rag::retrieve(s.db(), q, best_alone);
  EXPECT_LT(one.relevance, 0.7);
}

rag::ChunkRecord candidate(int64_t id, int64_t file, const std::string& text) {
  rag::ChunkRecord c;
  c.id = id;
  c.file_id = file;
  c.text = text;
  c.score = -10.0 + static_cast<double>(id);  // BM25: lower is better
  return c;
}

std::vector<int64_t> ids_of(const std::vector<rag::ChunkRecord>& chunks) {
  std::vector<int64_t> out;
  for (const rag::ChunkRecord& c : chunks) out.push_back(c.id);
  return out;
}

TEST(Diversity, CapsChunksPerFileWhileOthersMatch) {
  // File 1 holds the five best chunks, files 2 and 3 the next ones.
  std::vector<rag::ChunkRecord> cands;
  for (int64_t i = 1; i <= 5; ++i)
    cands.push_back(candidate(i, 1, "changelog entry " + std::to_string(i)));
  cands.push_back(candidate(6, 2, "glossary: LTS means long term support"));
  cands.push_back(candidate(7, 3, "release schedule of the project"));
  // k = 3: at most 2 of file 1, best first.
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 0)), (std::vector<int64_t>{1, 2, 6}));
  // k = 4: still 2 of file 1 (half of 4), then the other two files.
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 4, 0)), (std::vector<int64_t>{1, 2, 6, 7}));
  // k = 6: 3 of file 1, both others, then a fourth of file 1 fills the slot
  // no other file can.
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 6, 0)), (std::vector<int64_t>{1, 2, 3, 4, 6, 7}));
  // An explicit cap of 1.
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 1)), (std::vector<int64_t>{1, 6, 7}));
}

// A file's chunk past the cap keeps its slot when no other file's chunk
// holds as much of the question: a weaker match is not worth the trade.
TEST(Diversity, CapYieldsOnlyToAnotherFileAsRelevant) {
  std::vector<rag::ChunkRecord> cands;
  for (int64_t i = 1; i <= 3; ++i) {
    cands.push_back(candidate(i, 1, "build section " + std::to_string(i)));
    cands.back().relevance = 0.9;
  }
  cands.push_back(candidate(4, 2, "an unrelated library's build notes"));
  cands.back().relevance = 0.5;
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 0)), (std::vector<int64_t>{1, 2, 3}));
  cands.back().relevance = 0.9;
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 0)), (std::vector<int64_t>{1, 2, 4}));
}

TEST(Diversity, OneFileAloneStillFillsTheSlots) {
  std::vector<rag::ChunkRecord> cands;
  for (int64_t i = 1; i <= 4; ++i) cands.push_back(candidate(i, 1, "part " + std::to_string(i)));
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 0)), (std::vector<int64_t>{1, 2, 3}));
}

TEST(Diversity, SkipsNearRepeatsOfAPickedChunk) {
  const std::string entry = "fixed a crash when the config file is empty and the cache is cold";
  std::vector<rag::ChunkRecord> cands = {candidate(1, 1, entry), candidate(2, 2, entry + " again"),
                                         candidate(3, 3, "the cache directory moved"),
                                         candidate(4, 4, "empty config files are now valid")};
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 3, 0)), (std::vector<int64_t>{1, 3, 4}));
  // Only repeats left: they still fill the slots.
  EXPECT_EQ(ids_of(rag::pick_diverse(cands, 4, 0)), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(Retrieval, DiversityKeepsOneFileFromTakingEverySlot) {
  TempStore s;
  std::vector<std::string> log;
  for (int i = 0; i < 8; ++i)
    log.push_back("Version 1." + std::to_string(i) + " LTS release: LTS branch updated, LTS " +
                  std::to_string(i) + " fixes");
  s.add("CHANGELOG.md", log);
  s.add("glossary.md", {"LTS stands for long term support: a release maintained for years."});
  s.add("other.md", {"Unrelated text about gardening and lemon trees."});
  rag::RetrievalOptions plain;
  plain.diverse = false;
  auto files = [](const rag::Retrieval& r) {
    std::vector<std::string> f;
    for (const rag::ChunkRecord& c : r.chunks) f.push_back(c.display);
    return f;
  };
  const rag::Retrieval bm25 = rag::retrieve(s.db(), "What does LTS stand for?", plain);
  const rag::Retrieval diverse = rag::retrieve(s.db(), "What does LTS stand for?", {});
  ASSERT_TRUE(bm25.found && diverse.found);
  const std::vector<std::string> b = files(bm25), d = files(diverse);
  EXPECT_EQ(std::count(d.begin(), d.end(), "CHANGELOG.md"), 2);
  EXPECT_NE(std::find(d.begin(), d.end(), "glossary.md"), d.end());
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(b.size(), 3u);
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

TEST(Pull, Sha256HexShape) {
  EXPECT_TRUE(rag::is_sha256_hex(std::string(64, 'a')));
  EXPECT_TRUE(
      rag::is_sha256_hex("B179C9523D0E6A0F98A330C7562B682750A6F8C8C15E5BC70EA373728110DB53"));
  EXPECT_FALSE(rag::is_sha256_hex(std::string(63, 'a')));
  EXPECT_FALSE(rag::is_sha256_hex(std::string(65, 'a')));
  EXPECT_FALSE(rag::is_sha256_hex(std::string(63, 'a') + "g"));
  EXPECT_FALSE(rag::is_sha256_hex(""));
}

TEST(Pull, ToHex) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(rag::to_hex(bytes, 4), "000fa5ff");
  EXPECT_EQ(rag::to_hex(bytes, 0), "");
}

TEST(Pull, Sha256OfKnownTexts) {
  if (!rag::download_supported()) GTEST_SKIP() << "built without OpenSSL";
  // FIPS 180-2's test vectors.
  EXPECT_EQ(rag::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(rag::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(rag::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Pull, UrlFileName) {
  EXPECT_EQ(rag::url_file_name("https://huggingface.co/Qwen/R/resolve/main/q.gguf"), "q.gguf");
  EXPECT_EQ(rag::url_file_name("https://h/x/model.gguf?download=true#top"), "model.gguf");
  EXPECT_EQ(rag::url_file_name("http://h/a%20b.gguf"), "a b.gguf");
  EXPECT_EQ(rag::url_file_name("http://h/100%"), "100%");  // not an escape: kept
  EXPECT_EQ(rag::url_file_name("http://h/dir/"), "");
  EXPECT_EQ(rag::url_file_name("http://h"), "");
  EXPECT_EQ(rag::url_file_name("http://h/.."), "");
  EXPECT_EQ(rag::url_file_name("http://h/.hidden"), "");
  EXPECT_EQ(rag::url_file_name("http://h/a%2Fb.gguf"), "");  // a slash once decoded
  EXPECT_EQ(rag::url_file_name("http://h/a%2e%2e"), "a..");
  EXPECT_EQ(rag::url_file_name("http://h/%2e%2e"), "");
  EXPECT_EQ(rag::url_file_name("http://h/a%0ab"), "");
  EXPECT_EQ(rag::url_file_name("h/a.gguf"), "");  // no scheme
}

TEST(ModelCatalog, LookUpByNameAndFile) {
  const cbs::CatalogModel* m = cbs::find_catalog_model("qwen2.5-coder-0.5b");
  ASSERT_NE(m, nullptr);
  EXPECT_STREQ(m->file, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  EXPECT_EQ(cbs::find_catalog_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), m);
  EXPECT_EQ(cbs::find_catalog_file("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), m);
  EXPECT_EQ(cbs::find_catalog_file("qwen2.5-coder-0.5b"), nullptr);
  EXPECT_EQ(cbs::find_catalog_model("no-such-model"), nullptr);
  EXPECT_STREQ(cbs::default_catalog_model().name, "qwen2.5-coder-1.5b");
  for (const cbs::CatalogModel& e : cbs::model_catalog()) {
    EXPECT_TRUE(rag::is_sha256_hex(e.sha256)) << e.name;
    EXPECT_GT(e.size_bytes, 0u) << e.name;
    EXPECT_EQ(rag::url_file_name(e.url), e.file) << e.name;
  }
}

TEST(ModelCatalog, ModelsDir) {
  ::unsetenv("CB_MODELS_DIR");
  EXPECT_EQ(cbs::models_dir(""), "models");
  ::setenv("CB_MODELS_DIR", "/srv/models", 1);
  EXPECT_EQ(cbs::models_dir(""), "/srv/models");
  EXPECT_EQ(cbs::models_dir("mine"), "mine");
  ::setenv("CB_MODELS_DIR", "", 1);
  EXPECT_EQ(cbs::models_dir(""), "models");
  ::unsetenv("CB_MODELS_DIR");
}
