// rag_assistant's model-free parts: the chunker (driven by a word-counting
// stand-in for the tokenizer) and the FTS5 query built from a question (run
// against a real FTS5 table, so any syntax error would show).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "chunker.h"
#include "corpus_db.h"
#include "kv_store.h"
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
