// rag_assistant's model-free parts: the chunker (driven by a word-counting
// stand-in for the tokenizer) and the FTS5 query built from a question (run
// against a real FTS5 table, so any syntax error would show).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "app.h"
#include "chunker.h"
#include "corpus_db.h"
#include "kv_store.h"
#include "manage.h"
#include "model_catalog.h"
#include "printable.h"
#include "pull.h"
#include "retrieval.h"
#include "text_extract.h"

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

// ingest's text extraction: HTML, reStructuredText, gzip, PDF and the text
// detector for files of other names.
namespace {

std::string html(std::string_view page, std::string* title = nullptr) {
  std::string t;
  std::string text = rag::html_to_text(page, &t);
  if (title != nullptr) *title = t;
  return text;
}

TEST(HtmlText, DecodesEntities) {
  EXPECT_EQ(html("<p>A &amp; B &lt;c&gt; &quot;d&quot; &apos;e&apos;</p>"),
            "A & B <c> \"d\" 'e'\n");
  EXPECT_EQ(html("&#65;&#x42;&#X43;&#68 &#x1F600; &copy; &eacute;&Eacute; &euro;"),
            "ABCD \xF0\x9F\x98\x80 \xC2\xA9 \xC3\xA9\xC3\x89 \xE2\x82\xAC\n");
  // Unknown, unterminated and impossible references.
  EXPECT_EQ(html("&bogus; &amp &#; &#x; AT&T &#0; &#xD800; &#99999999999;"),
            "&bogus; &amp &#; &#x; AT&T \xEF\xBF\xBD \xEF\xBF\xBD \xEF\xBF\xBD\n");
  // Numeric references in 0x80..0x9F mean Windows-1252's characters.
  EXPECT_EQ(html("&#150;&#147;x&#148;"), "\xE2\x80\x93\xE2\x80\x9Cx\xE2\x80\x9D\n");
  EXPECT_EQ(html("a&nbsp;&nbsp;b"), "a b\n");
}

TEST(HtmlText, DropsScriptsStylesCommentsAndTheHead) {
  std::string title;
  const std::string text = html(
      "<!DOCTYPE html><html><head><meta charset=utf-8><title> The  &amp; Page </title>"
      "<style>p { color: red }</style><script>var hidden = '<p>no</p>';</script>"
      "<link rel=stylesheet href=x.css></head>"
      "<body><!-- a comment with <p>tags</p> --><p>Visible text.</p>"
      "<SCRIPT type=\"text/javascript\">document.write('also hidden')</SCRIPT>"
      "<noscript>Enable scripts.</noscript></body></html>",
      &title);
  EXPECT_EQ(title, "The & Page");
  EXPECT_EQ(text, "Visible text.\n\nEnable scripts.\n");
}

TEST(HtmlText, HeadingsBecomeMarkdownHeadingsTheChunkerFollows) {
  std::string title;
  const std::string text = html(
      "<h1>Guide</h1><p>Intro.</p><h2 id=\"o\">Offices <small>(all)</small></h2>"
      "<h3>Bergen</h3><p>The Bergen office has a harbour view. It opens at nine.</p><h2></h2>",
      &title);
  EXPECT_EQ(title, "Guide");  // no <title>: the first <h1>
  EXPECT_EQ(text,
            "# Guide\n\nIntro.\n\n## Offices (all)\n\n### Bergen\n\n"
            "The Bergen office has a harbour view. It opens at nine.\n");
  const WordTokens tok;
  const auto chunks = rag::chunk_text(text, 8, tok);
  ASSERT_FALSE(chunks.empty());
  // The last chunk is cut from the middle of a section and still says where.
  EXPECT_EQ(chunks.back().text, "# Guide\n## Offices (all)\n### Bergen\n\nIt opens at nine.");
}

TEST(HtmlText, BlockElementsBreakLines) {
  EXPECT_EQ(html("<p>one</p><p>two<br>three</p><div>four</div><div>five</div>"),
            "one\n\ntwo\nthree\n\nfour\nfive\n");
  EXPECT_EQ(html("<ul><li>apples<li>pears</ul>after"), "- apples\n- pears\n\nafter\n");
  EXPECT_EQ(html("<table><tr><th>City<th>Staff<tr><td>Oslo</td><td>12</td></tr></table>"),
            "City | Staff\nOslo | 12\n");
  EXPECT_EQ(html("<p>  spaced\n\n   out\ttext </p>"), "spaced out text\n");
  EXPECT_EQ(html("<pre>\nline 1\n  indented &lt;x&gt;\n</pre><p>after</p>"),
            "line 1\n  indented <x>\n\nafter\n");
  EXPECT_EQ(html("in<b>line</b> <i>tags</i> join"), "inline tags join\n");
}

TEST(HtmlText, LegacyEncodingIsTranscoded) {
  // Not valid UTF-8: read as Windows-1252 (Latin-1's superset).
  EXPECT_EQ(html("<p>caf\xE9 \x93quoted\x94</p>"), "caf\xC3\xA9 \xE2\x80\x9Cquoted\xE2\x80\x9D\n");
}

TEST(HtmlText, MalformedInputNeverFails) {
  struct Case {
    const char* in;
    const char* out;
  };
  const Case cases[] = {
      {"", ""},
      {"<", "<\n"},
      {"<<<>>>", "<<<>>>\n"},
      {"a < b and c > d", "a < b and c > d\n"},
      {"1 <2 and x<y", "1 <2 and x<y\n"},
      {"text <p", "text <p\n"},
      {"before</", "before</\n"},
      {"<script>alert(1)", ""},
      {"<style>p {}", ""},
      {"kept<!-- never closed <p>lost</p>", "kept\n"},
      {"<h1>an unclosed heading", "# an unclosed heading\n"},
      {"<h2>title<p>body text", "## title\n\nbody text\n"},
      {"<a href='x>text</a> more", "text more\n"},
      {"<a href=\"unclosed>quote", "quote\n"},
      {"<p>unclosed <b>bold <i>italic", "unclosed bold italic\n"},
      {"</p></div></li>stray closers", "stray closers\n"},
      {"<title>never closed", ""},
      {"<pre>unclosed pre\n  keeps", "unclosed pre\n  keeps\n"},
      {"<!DOCTYPE", ""},
      {"<?xml version", ""},
      {"&#x110000;&#xFFFFFFFFFFFFFFFF;", "\xEF\xBF\xBD\xEF\xBF\xBD\n"},
      {"<h1>"
       "<h2>"
       "<h3>x</h1>",
       "### x\n"},
  };
  for (const Case& c : cases) EXPECT_EQ(html(c.in), c.out) << c.in;
  // A long unclosed heading is text, not a heading every chunk would carry.
  const std::string long_heading = html("<h1>" + std::string(300, 'w'));
  EXPECT_EQ(long_heading, std::string(300, 'w') + "\n");
  // Random soup of markup characters: never a crash, never a NUL or '\r'.
  std::mt19937 rng(12345);
  const std::string alphabet = "<>/!-&#;x=\"' \nahp1bsript";
  for (int round = 0; round < 3000; ++round) {
    std::string soup;
    const size_t len = rng() % 80;
    for (size_t i = 0; i < len; ++i) soup += alphabet[rng() % alphabet.size()];
    if (round % 3 == 0) soup = "<script>" + soup;
    if (round % 5 == 0) soup += std::string(1, static_cast<char>(rng() % 256));
    std::string title;
    const std::string text = rag::html_to_text(soup, &title);
    EXPECT_EQ(text.find('\0'), std::string::npos) << soup;
    EXPECT_EQ(text.find('\r'), std::string::npos) << soup;
  }
}

// Malformed pages that a naive parser would rescan to the end for every
// '<' (hours for a few megabytes) are read in linear time.
TEST(HtmlText, PathologicalMarkupStaysLinear) {
  const auto start = std::chrono::steady_clock::now();
  std::string quoted_gt;  // '>' only ever inside quotes
  for (int i = 0; i < 100000; ++i) quoted_gt += "<a x='>'";
  std::string no_gt;  // tags that never close
  for (int i = 0; i < 500000; ++i) no_gt += "<a ";
  std::string late_gt = no_gt + ">after";
  std::string unclosed_quotes;
  for (int i = 0; i < 100000; ++i) unclosed_quotes += "<b c=\"d> text ";
  EXPECT_EQ(html(no_gt).size(), no_gt.size());  // all text ('<' that opens no tag)
  EXPECT_EQ(html(late_gt), "after\n");          // one long tag
  html(quoted_gt);
  html(unclosed_quotes);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
}

TEST(TextDetection, ByContent) {
  EXPECT_TRUE(rag::looks_like_text("Plain README text.\r\n\tIndented.\f\n"));
  EXPECT_TRUE(rag::looks_like_text("UTF-8: caf\xC3\xA9, \xE6\x9D\xB1\xE4\xBA\xAC"));
  EXPECT_TRUE(rag::looks_like_text(""));
  // A character cut by the end of the sample is fine; one broken inside is not.
  EXPECT_TRUE(rag::looks_like_text("cut caf\xC3"));
  EXPECT_FALSE(rag::looks_like_text("broken caf\xC3 here"));
  EXPECT_FALSE(rag::looks_like_text("latin-1 caf\xE9 here"));
  EXPECT_FALSE(rag::looks_like_text("overlong \xC0\xAF and surrogate"));
  EXPECT_FALSE(rag::looks_like_text("surrogate \xED\xA0\x80 here"));
  EXPECT_FALSE(rag::looks_like_text(std::string_view("nul\0byte", 8)));
  // A few escape sequences (a colour log) pass; a control-heavy header not.
  std::string log(500, 'a');
  log += "\x1b[31mred\x1b[0m";
  EXPECT_TRUE(rag::looks_like_text(log));
  EXPECT_FALSE(rag::looks_like_text("\x01\x02\x03\x04ELF-ish header with some text in it"));
  EXPECT_EQ(rag::not_text_reason("text"), nullptr);
  EXPECT_NE(std::string(rag::not_text_reason(std::string_view("a\0b", 3))).find("NUL"),
            std::string::npos);
  EXPECT_NE(std::string(rag::not_text_reason("caf\xE9 au lait")).find("UTF-8"), std::string::npos);
  EXPECT_NE(std::string(rag::not_text_reason("\x01\x02\x03\x04\x05")).find("control"),
            std::string::npos);
}

TEST(TextDetection, FilesOfOtherNames) {
  EXPECT_TRUE(rag::has_supported_extension("dir/Notes.MD"));
  EXPECT_TRUE(rag::has_supported_extension("changelog.Debian.gz"));
  EXPECT_TRUE(rag::has_supported_extension("a.pdf"));
  EXPECT_FALSE(rag::has_supported_extension("README"));
  EXPECT_FALSE(rag::has_supported_extension("picture.png"));
  EXPECT_FALSE(rag::has_supported_extension(".hidden"));

  rag::ExtractedText r = rag::extract_text("docs/README", "The tool copies files.\n", 1 << 20);
  EXPECT_EQ(r.skipped, "");
  EXPECT_EQ(r.text, "The tool copies files.\n");
  EXPECT_EQ(r.title, "README");
  r = rag::extract_text("LICENSE", "# The License\n\nText.\n", 1 << 20);
  EXPECT_EQ(r.title, "The License");
  r = rag::extract_text("picture.png", std::string_view("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16),
                        1 << 20);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  EXPECT_TRUE(r.text.empty());
  r = rag::extract_text("blob.md", std::string_view("# x\n\0\1", 6), 1 << 20);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  r = rag::extract_text("blank.txt", " \n\t\n", 1 << 20);
  EXPECT_EQ(r.skipped, "empty");
  r = rag::extract_text("notes.md", "# Notes\n\nBody.\n", 1 << 20);
  EXPECT_EQ(r.title, "Notes");
  EXPECT_TRUE(r.title_from_text);
  r = rag::extract_text("plain.txt", "Body.\n", 1 << 20);
  EXPECT_EQ(r.title, "plain");
}

TEST(RstText, TitlesBecomeHeadings) {
  std::string title;
  const std::string text = rag::rst_to_markdown(
      "=========\n Kestrel \n=========\n\nIntro.\n\nInstalling\n==========\n\nRun it.\n\n"
      "From source\n-----------\nBuild it.\n\nUsage\n=====\n\nAsk.\n",
      &title);
  EXPECT_EQ(title, "Kestrel");
  EXPECT_EQ(text,
            "# Kestrel\n\nIntro.\n\n## Installing\n\nRun it.\n\n### From source\n\nBuild it.\n\n"
            "## Usage\n\nAsk.\n");
  // Through extract_text: the first title is the file's title.
  const rag::ExtractedText r =
      rag::extract_text("guide.rst", "Guide\n~~~~~\n\nText.\n", uint64_t{1} << 20);
  EXPECT_EQ(r.title, "Guide");
  EXPECT_EQ(r.text, "# Guide\n\nText.\n");
}

TEST(RstText, WhatIsNotATitle) {
  std::string title;
  // An underline shorter than the text, a transition between blank lines,
  // an indented line (a block quote or literal block), a line inside a
  // paragraph.
  const std::string in =
      "A long title line\n===\n\ntext\n\n----\n\nmore\n\n    indented\n    --------\n\n"
      "para line one\nline two\n--------\n";
  EXPECT_EQ(rag::rst_to_markdown(in, &title), in);
  EXPECT_EQ(title, "");
  EXPECT_EQ(rag::extract_text("notes.rst", "Just text.\n", 1 << 20).title, "notes");
}

std::string gzip_of(std::string_view data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(Gzip, InflatesMembersAndRefusesBadData) {
  std::string error;
  EXPECT_EQ(rag::gunzip(gzip_of("hello gzip\n"), 1 << 20, &error), "hello gzip\n");
  // Concatenated members (gzip a >> f; gzip b >> f), then zero padding.
  const std::string two = gzip_of("first ") + gzip_of("second") + std::string(8, '\0');
  EXPECT_EQ(rag::gunzip(two, 1 << 20, &error), "first second");
  const std::string whole = gzip_of(std::string(5000, 'q') + "tail");
  EXPECT_FALSE(rag::gunzip(whole.substr(0, whole.size() - 6), 1 << 20, &error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_FALSE(rag::gunzip("plain text", 1 << 20, &error));
  EXPECT_EQ(error, "not gzip data");
  std::string corrupt = gzip_of("some text that deflates into a real stream");
  for (size_t i = 12; i < corrupt.size() - 8; ++i) corrupt[i] = static_cast<char>(0xA5 ^ i);
  EXPECT_FALSE(rag::gunzip(corrupt, 1 << 20, &error));
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(rag::gunzip("", 1 << 20, &error));
}

TEST(Gzip, ABombStopsAtTheBound) {
  // 16 MiB of zeros deflate to ~16 KB; with a 1 MiB bound inflation stops
  // there instead of building the whole text.
  const std::string bomb = gzip_of(std::string(size_t{16} << 20, '\0'));
  ASSERT_LT(bomb.size(), size_t{64} << 10);
  std::string error;
  EXPECT_FALSE(rag::gunzip(bomb, uint64_t{1} << 20, &error));
  EXPECT_NE(error.find("more than the 1.0 MB"), std::string::npos) << error;
  const rag::ExtractedText r = rag::extract_text("bomb.txt.gz", bomb, uint64_t{1} << 20);
  EXPECT_NE(r.skipped.find("--max-file-mb"), std::string::npos) << r.skipped;
  // Exactly at the bound is fine.
  EXPECT_EQ(rag::gunzip(gzip_of(std::string(1000, 'z')), 1000, &error)->size(), 1000u);
  EXPECT_FALSE(rag::gunzip(gzip_of(std::string(1001, 'z')), 1000, &error));
}

TEST(Gzip, TheInnerNameGivesTheType) {
  const uint64_t mb = uint64_t{1} << 20;
  rag::ExtractedText r = rag::extract_text("d/notes.md.gz", gzip_of("# Notes\n\nBody.\n"), mb);
  EXPECT_EQ(r.title, "Notes");
  EXPECT_EQ(r.text, "# Notes\n\nBody.\n");
  r = rag::extract_text("page.HTML.gz", gzip_of("<title>T</title><h2>Part</h2>x &amp; y"), mb);
  EXPECT_EQ(r.title, "T");
  EXPECT_EQ(r.text, "## Part\n\nx & y\n");
  r = rag::extract_text("changelog.Debian.gz", gzip_of("pkg (1.0) unstable\n"), mb);
  EXPECT_EQ(r.skipped, "");
  EXPECT_EQ(r.title, "changelog.Debian");
  r = rag::extract_text("data.tar.gz", gzip_of(std::string("ustar\0\0\0\x01\x02", 10)), mb);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  r = rag::extract_text("x.txt.gz.gz", gzip_of(gzip_of("x")), mb);
  EXPECT_FALSE(r.skipped.empty());
  r = rag::extract_text("broken.gz", "\x1f\x8b not really", mb);
  EXPECT_FALSE(r.skipped.empty());
}

// A minimal PDF: one page per string (Helvetica text lines), an /Info title,
// and the cross-reference table's byte offsets computed as a writer would.
std::string minimal_pdf(const std::vector<std::string>& pages, const std::string& title) {
  std::vector<std::string> objs = {"<< /Type /Catalog /Pages 2 0 R >>", "",
                                   "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                                   "<< /Title (" + title + ") >>"};
  std::string kids;
  for (size_t i = 0; i < pages.size(); ++i) {
    const size_t page_obj = objs.size() + 1;
    const std::string content = "BT /F1 12 Tf 72 720 Td (" + pages[i] + ") Tj ET";
    objs.push_back(
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << "
        "/F1 3 0 R >> >> /Contents " +
        std::to_string(page_obj + 1) + " 0 R >>");
    objs.push_back("<< /Length " + std::to_string(content.size()) + " >>\nstream\n" + content +
                   "\nendstream");
    kids += std::to_string(page_obj) + " 0 R ";
  }
  objs[1] = "<< /Type /Pages /Kids [" + kids + "] /Count " + std::to_string(pages.size()) + " >>";
  std::string out = "%PDF-1.4\n";
  std::vector<size_t> offsets;
  for (size_t i = 0; i < objs.size(); ++i) {
    offsets.push_back(out.size());
    out += std::to_string(i + 1) + " 0 obj\n" + objs[i] + "\nendobj\n";
  }
  const size_t xref = out.size();
  out += "xref\n0 " + std::to_string(objs.size() + 1) + "\n0000000000 65535 f \n";
  for (size_t off : offsets) {
    char entry[32];
    std::snprintf(entry, sizeof entry, "%010zu 00000 n \n", off);
    out += entry;
  }
  out += "trailer\n<< /Size " + std::to_string(objs.size() + 1) +
         " /Root 1 0 R /Info 4 0 R >>\nstartxref\n" + std::to_string(xref) + "\n%%EOF\n";
  return out;
}

TEST(PdfText, PagesTitleAndBrokenFiles) {
  const std::string pdf =
      minimal_pdf({"The heron nests by the quay.", "Second page here."}, "Harbour Notes");
  const uint64_t mb = uint64_t{1} << 20;
  rag::ExtractedText r = rag::extract_text("notes.pdf", pdf, mb);
  if (!rag::pdf_supported()) {
    EXPECT_EQ(r.skipped, "built without PDF support");
    GTEST_SKIP() << "built without poppler-cpp";
  }
  ASSERT_EQ(r.skipped, "");
  EXPECT_EQ(r.text, "The heron nests by the quay.\n\nSecond page here.\n");
  EXPECT_EQ(r.title, "Harbour Notes");
  EXPECT_FALSE(r.title_from_text);
  r = rag::extract_text("untitled.pdf", minimal_pdf({"Text."}, ""), mb);
  EXPECT_EQ(r.title, "untitled");
  // Gzip-compressed, too.
  r = rag::extract_text("notes.pdf.gz", gzip_of(pdf), mb);
  EXPECT_EQ(r.text, "The heron nests by the quay.\n\nSecond page here.\n");
  // No text (a scanned page would be an image), garbage, a cut-off file.
  r = rag::extract_text("blank.pdf", minimal_pdf({""}, "Blank"), mb);
  EXPECT_NE(r.skipped.find("no text"), std::string::npos) << r.skipped;
  r = rag::extract_text("junk.pdf", "%PDF-1.4\nnothing else", mb);
  EXPECT_NE(r.skipped.find("not a readable PDF"), std::string::npos) << r.skipped;
  r = rag::extract_text("cut.pdf", pdf.substr(0, 40), mb);
  EXPECT_FALSE(r.skipped.empty());
  // Text over the bound is skipped.
  r = rag::extract_text(
      "big.pdf",
      minimal_pdf(std::vector<std::string>(12, "forty characters of text on every page"), ""), 400);
  EXPECT_NE(r.skipped.find("--max-file-mb"), std::string::npos) << r.skipped;
}

}  // namespace

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
