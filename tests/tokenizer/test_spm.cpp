// A hand-made SentencePiece ("llama") vocabulary: the U+2581 space prefix,
// score-ordered merges, byte fallback, special tokens, decode stripping the
// added space.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {
namespace {

const std::string kSp = "\xE2\x96\x81";  // U+2581

struct Piece {
  std::string text;
  float score;
};

// <unk>, <s>, </s>, 256 byte tokens (id 3 + byte), then `pieces`.
TokenizerVocab spm_vocab(const std::vector<Piece>& pieces, bool byte_tokens = true) {
  TokenizerVocab v;
  v.model = "llama";
  const auto add = [&](const std::string& text, float score, TokenType type) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.token_types.push_back(static_cast<int32_t>(type));
  };
  add("<unk>", 0, TokenType::kUnknown);
  add("<s>", 0, TokenType::kControl);
  add("</s>", 0, TokenType::kControl);
  if (byte_tokens) {
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      add(hex, 0, TokenType::kByte);
    }
  }
  for (const Piece& p : pieces) add(p.text, p.score, TokenType::kNormal);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return v;
}

const std::vector<Piece> kHello = {
    {kSp, -10},
    {"a", -10},
    {"b", -10},
    {"c", -10},
    {"e", -10},
    {"h", -10},
    {"l", -10},
    {"o", -10},
    {"ll", -2},
    {"llo", -1},
    {kSp + "h", -3},
    {kSp + "he", -0.5f},
    {kSp + "hello", -0.1f},
    {"he", -4},
    {"ab", -5},
    {"bc", -1},
};

int32_t id_of(const Tokenizer& t, const std::string& text) {
  const auto id = t.find_token(text);
  EXPECT_TRUE(id.has_value()) << text;
  return id.value_or(-1);
}

TEST(SentencePiece, SpacePrefixAndMergesByScore) {
  const Tokenizer t(spm_vocab(kHello));
  // ▁ h e l l o: ll (-2), llo (-1), ▁h (-3), ▁he (-0.5), ▁hello (-0.1).
  EXPECT_EQ(t.encode("hello", false, false), (std::vector<int32_t>{id_of(t, kSp + "hello")}));
  EXPECT_EQ(t.encode("hello hello", true, false),
            (std::vector<int32_t>{1, id_of(t, kSp + "hello"), id_of(t, kSp + "hello")}));
  // "bc" (-1) outscores "ab" (-5).
  EXPECT_EQ(t.encode("abc", false, false),
            (std::vector<int32_t>{id_of(t, kSp), id_of(t, "a"), id_of(t, "bc")}));
}

TEST(SentencePiece, ScoresNotOrderDecide) {
  std::vector<Piece> pieces = kHello;
  for (Piece& p : pieces) {
    if (p.text == "ab") p.score = -0.5f;  // now "ab" beats "bc"
  }
  const Tokenizer t(spm_vocab(pieces));
  EXPECT_EQ(t.encode("abc", false, false),
            (std::vector<int32_t>{id_of(t, kSp), id_of(t, "ab"), id_of(t, "c")}));
}

TEST(SentencePiece, ByteFallbackForUnknownCharacters) {
  const Tokenizer t(spm_vocab(kHello));
  // "é" is no token: its UTF-8 bytes C3 A9 become <0xC3> <0xA9>.
  EXPECT_EQ(t.encode("é", false, false), (std::vector<int32_t>{id_of(t, kSp), 3 + 0xC3, 3 + 0xA9}));
  for (const std::string s : {"héllo wörld", "日本",
                              "a\xFF"
                              "b",
                              "  two  spaces ", "\n"}) {
    EXPECT_EQ(t.decode(t.encode(s, true, false)), s) << s;
  }
  EXPECT_EQ(t.token_to_piece(3 + 'A'), "A");
}

TEST(SentencePiece, UnknownTokenWithoutByteTokens) {
  const Tokenizer t(spm_vocab(kHello, /*byte_tokens=*/false));
  // One <unk> per unknown character, not per byte.
  EXPECT_EQ(t.encode("aé", false, false), (std::vector<int32_t>{id_of(t, kSp), id_of(t, "a"), 0}));
}

TEST(SentencePiece, DecodeStripsOnlyTheAddedSpace) {
  const Tokenizer t(spm_vocab(kHello));
  const std::vector<int32_t> ids = t.encode("hello", true, false);
  EXPECT_EQ(t.token_to_piece(ids.back()), " hello");
  EXPECT_EQ(t.decode(ids), "hello");
  EXPECT_EQ(t.decode(ids, /*render_special=*/true), "<s> hello");
  // Leading spaces of the text itself survive.
  EXPECT_EQ(t.decode(t.encode(" hello", true, false)), " hello");
}

TEST(SentencePiece, NoSpacePrefixWhenTheFileSaysSo) {
  TokenizerVocab v = spm_vocab(kHello);
  v.add_space_prefix = false;
  const Tokenizer t(std::move(v));
  EXPECT_EQ(t.encode("hello", false, false),
            (std::vector<int32_t>{id_of(t, "he"), id_of(t, "llo")}));
  EXPECT_EQ(t.decode(t.encode("hello", false, false)), "hello");
}

TEST(SentencePiece, SpecialTokensInText) {
  const Tokenizer t(spm_vocab(kHello));
  const int32_t hello = id_of(t, kSp + "hello");
  // As llama.cpp does, text after a special token gets the space prefix too.
  EXPECT_EQ(t.encode("hello</s>hello", false, true), (std::vector<int32_t>{hello, 2, hello}));
  EXPECT_NE(t.encode("hello</s>hello", false, false), (std::vector<int32_t>{hello, 2, hello}));
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_EQ(t.bos_id(), 1);
}

TEST(SentencePiece, MalformedVocabularies) {
  const auto expect_error = [](TokenizerVocab v, ErrorCode code) {
    try {
      Tokenizer t(std::move(v));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  TokenizerVocab no_scores = spm_vocab(kHello);
  no_scores.scores.clear();
  expect_error(no_scores, ErrorCode::kFormat);
  TokenizerVocab short_types = spm_vocab(kHello);
  short_types.token_types.pop_back();
  expect_error(short_types, ErrorCode::kFormat);
  TokenizerVocab bad_type = spm_vocab(kHello);
  bad_type.token_types[5] = 42;
  expect_error(bad_type, ErrorCode::kFormat);
  TokenizerVocab bad_bos = spm_vocab(kHello);
  bad_bos.bos_id = 100000;
  expect_error(bad_bos, ErrorCode::kFormat);
  TokenizerVocab bad_byte = spm_vocab(kHello);
  bad_byte.tokens[3] = "<0xZZ>";
  expect_error(bad_byte, ErrorCode::kFormat);
  TokenizerVocab no_fallback = spm_vocab(kHello, /*byte_tokens=*/false);
  no_fallback.unk_id = -1;
  no_fallback.token_types[0] = static_cast<int32_t>(TokenType::kNormal);
  expect_error(no_fallback, ErrorCode::kFormat);
  TokenizerVocab other_model = spm_vocab(kHello);
  other_model.model = "bert";
  expect_error(other_model, ErrorCode::kUnsupported);
}

TEST(SentencePiece, DecodeRejectsIdsOutOfRange) {
  const Tokenizer t(spm_vocab(kHello));
  for (const int32_t bad : {-1, t.n_vocab(), 1 << 30}) {
    try {
      t.decode(std::vector<int32_t>{bad});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace cb
