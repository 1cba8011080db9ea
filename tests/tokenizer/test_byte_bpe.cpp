// A hand-made byte-level BPE vocabulary: merge ranks decide the result,
// Llama 3's ignore_merges, byte tokens for arbitrary bytes, decode.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/tokenizer/byte_bpe.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {
namespace {

using tok::ByteLevelBpe;

// 256 byte tokens (id = byte value), then the given extra tokens; merges
// are written "left|right" in raw bytes.
TokenizerVocab tiny_vocab(const std::string& pre, std::vector<std::string> extra,
                          std::vector<std::string> merges) {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = pre;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteLevelBpe::to_token_text(std::string(1, static_cast<char>(b))));
  }
  for (auto& t : extra) v.tokens.push_back(ByteLevelBpe::to_token_text(t));
  for (auto& m : merges) {
    const size_t bar = m.find('|');  // "left|right" in raw bytes
    m = ByteLevelBpe::to_token_text(m.substr(0, bar)) + " " +
        ByteLevelBpe::to_token_text(m.substr(bar + 1));
  }
  v.merges = std::move(merges);
  return v;
}

int32_t id_of(const Tokenizer& t, const std::string& raw) {
  const auto id = t.find_token(ByteLevelBpe::to_token_text(raw));
  EXPECT_TRUE(id.has_value()) << raw;
  return id.value_or(-1);
}

TEST(ByteBpe, LowestRankMergesFirst) {
  // "abc": with "b c" ranked before "a b" the result is a|bc, else ab|c.
  const Tokenizer bc_first(tiny_vocab("gpt2", {"ab", "bc"}, {"b|c", "a|b"}));
  EXPECT_EQ(bc_first.encode("abc", false, false),
            (std::vector<int32_t>{'a', id_of(bc_first, "bc")}));
  const Tokenizer ab_first(tiny_vocab("gpt2", {"ab", "bc"}, {"a|b", "b|c"}));
  EXPECT_EQ(ab_first.encode("abc", false, false),
            (std::vector<int32_t>{id_of(ab_first, "ab"), 'c'}));
}

TEST(ByteBpe, MergesChainAndSpacesAreBytes) {
  const Tokenizer t(tiny_vocab("gpt2", {"he", "ll", "hell", "hello", " h"},
                               {"l|l", " |h", "h|e", "he|ll", "hell|o"}));
  // "hello" merges all the way; in " hello" the space takes the h first
  // (rank 1 beats "h|e"), which blocks the rest.
  const std::vector<int32_t> ids = t.encode("hello hello", false, false);
  EXPECT_EQ(ids,
            (std::vector<int32_t>{id_of(t, "hello"), id_of(t, " h"), 'e', id_of(t, "ll"), 'o'}));
  EXPECT_EQ(t.decode(ids), "hello hello");
  // Equal pairs resolve leftmost first: "lll" -> ll|l.
  EXPECT_EQ(t.encode("lll", false, false), (std::vector<int32_t>{id_of(t, "ll"), 'l'}));
}

TEST(ByteBpe, IgnoreMergesTakesWholeWordTokens) {
  // "abc" is a token no merge leads to.  Llama 3 uses it whole; GPT-2 not.
  const std::vector<std::string> extra = {"ab", "abc"};
  const std::vector<std::string> merges = {"a|b"};
  const Tokenizer llama3(tiny_vocab("llama3", extra, merges));
  const Tokenizer gpt2(tiny_vocab("gpt2", extra, merges));
  EXPECT_EQ(llama3.encode("abc", false, false), (std::vector<int32_t>{id_of(llama3, "abc")}));
  EXPECT_EQ(gpt2.encode("abc", false, false), (std::vector<int32_t>{id_of(gpt2, "ab"), 'c'}));
}

TEST(ByteBpe, EveryByteRoundTrips) {
  const Tokenizer t(tiny_vocab("gpt2", {"ab"}, {"a|b"}));
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<int32_t> ids = t.encode(all, false, false);
  EXPECT_EQ(t.decode(ids), all);
  EXPECT_EQ(t.token_to_piece(' '), " ");
  EXPECT_EQ(t.token_to_piece(0xFF), "\xFF");
}

TEST(ByteBpe, MissingByteTokenBecomesUnknown) {
  TokenizerVocab v = tiny_vocab("gpt2", {"<unk>"}, {});
  v.tokens[0x7F] = "<del-removed>";  // byte 0x7F now has no token
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  v.token_types.back() = static_cast<int32_t>(TokenType::kUnknown);
  v.unk_id = static_cast<int32_t>(v.tokens.size()) - 1;
  const Tokenizer t(std::move(v));
  EXPECT_EQ(t.encode("a\x7F", false, false),
            (std::vector<int32_t>{'a', t.find_token("<unk>").value()}));
}

TEST(ByteBpe, AddedBosEosAndSpecialTokens) {
  TokenizerVocab v = tiny_vocab("gpt2", {"<s>", "</s>", "<tool>"}, {});
  const auto n = static_cast<int32_t>(v.tokens.size());
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  v.tokens[n - 3] = "<s>";
  v.tokens[n - 2] = "</s>";
  v.tokens[n - 1] = "<tool>";
  v.token_types[n - 3] = v.token_types[n - 2] = static_cast<int32_t>(TokenType::kControl);
  v.token_types[n - 1] = static_cast<int32_t>(TokenType::kUserDefined);
  v.bos_id = n - 3;
  v.eos_id = n - 2;
  v.add_bos = true;
  v.add_eos = true;
  const Tokenizer t(std::move(v));
  // Control tokens only with parse_special; user-defined ones always.
  EXPECT_EQ(t.encode("a</s>", true, true), (std::vector<int32_t>{n - 3, 'a', n - 2, n - 2}));
  EXPECT_EQ(t.encode("<tool>", false, false), (std::vector<int32_t>{n - 1}));
  const std::vector<int32_t> plain = t.encode("</s>", false, false);
  EXPECT_EQ(plain.size(), 4u);
  EXPECT_EQ(t.decode(plain), "</s>");
  // Control tokens are hidden unless rendered; user-defined text always shows.
  EXPECT_EQ(t.decode(std::vector<int32_t>{n - 3, 'a', n - 1, n - 2}), "a<tool>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{n - 3, 'a', n - 2}, true), "<s>a</s>");
  EXPECT_TRUE(t.is_end_of_generation(n - 2));
  EXPECT_FALSE(t.is_end_of_generation(n - 3));
}

// The end-of-turn and end-of-message ids of the metadata end a generation
// whatever their text (Llama 3.1 names <|eom_id|> by id).
TEST(ByteBpe, MetadataEndIdsEndAGeneration) {
  TokenizerVocab v = tiny_vocab("gpt2", {"<turn-over>", "<msg-over>", "<other>"}, {});
  const auto n = static_cast<int32_t>(v.tokens.size());
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  v.eot_id = n - 3;
  v.eom_id = n - 2;
  const Tokenizer t(std::move(v));
  EXPECT_TRUE(t.is_end_of_generation(n - 3));
  EXPECT_TRUE(t.is_end_of_generation(n - 2));
  EXPECT_FALSE(t.is_end_of_generation(n - 1));
}

TEST(ByteBpe, BadMergesAreFormatErrors) {
  const auto expect_format_error = [](TokenizerVocab v) {
    try {
      Tokenizer t(std::move(v));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
    }
  };
  TokenizerVocab no_space = tiny_vocab("gpt2", {"ab"}, {});
  no_space.merges = {"ab"};
  expect_format_error(no_space);
  expect_format_error(tiny_vocab("gpt2", {}, {"a|b"}));  // result "ab" missing
  TokenizerVocab missing_side = tiny_vocab("gpt2", {"ab"}, {});
  missing_side.merges = {"a zz"};
  expect_format_error(missing_side);
  TokenizerVocab duplicate = tiny_vocab("gpt2", {"a"}, {});  // "a" twice
  expect_format_error(duplicate);
}

}  // namespace
}  // namespace cb
