// The default model's tokenizer (SmolLM2: byte-level BPE, pre "smollm").
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/chat_format.h"
#include "tests/tokenizer/tokenizer_test_util.h"

namespace cb {
namespace {

using test::model_tokenizer;
using Ids = std::vector<int32_t>;

TEST(SmolLM2Tokenizer, MetadataFromTheFile) {
  const Tokenizer& t = model_tokenizer();
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_EQ(t.bos_id(), 1);  // <|im_start|>
  EXPECT_EQ(t.eos_id(), 2);  // <|im_end|>
  EXPECT_EQ(t.find_token("<|im_start|>"), 1);
  EXPECT_EQ(t.find_token("<|im_end|>"), 2);
  EXPECT_FALSE(t.find_token("no such token text").has_value());
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_TRUE(t.is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_FALSE(t.is_end_of_generation(*t.find_token("Hello")));
}

TEST(SmolLM2Tokenizer, RoundTripsAnyText) {
  const Tokenizer& t = model_tokenizer();
  const std::vector<std::string> texts = {
      "",
      "Hello World! The Quick BROWN fox.",
      "In 2024, 1234567890123456789 people paid $3.14159; 42% agreed.",
      "Wait... what?! (yes) [no] {maybe} <tag> a-b_c/d\\e @#&* ~`^|",
      "a  b   c    d\t\te \t f\t   ",
      "line1\nline2\n\n\nline3\r\nline4\r\n\r\n",
      "Café naïve résumé Ångström Zürich Ærøskøbing",
      "日本語のテキストと中文文本，한국어 텍스트。",
      "Emoji: 😀🎉👍🏽 ❤️ 🇫🇷 👨‍👩‍👧",
      "don't I'll it's DON'T It'S",
      "invalid \xF0\xF4 bytes \xC3\x28 and truncated \xE6\x97",
      "\x80\x80\x80 lone continuation bytes \xED\xA0\x80 (a surrogate)",
      std::string("nul\0byte", 8),
      "<|im_start|> is plain text here",
  };
  for (const std::string& s : texts) {
    const Ids ids = t.encode(s, false, false);
    EXPECT_EQ(t.decode(ids), s) << s;
    std::string pieces;
    for (const int32_t id : ids) pieces += t.token_to_piece(id);
    EXPECT_EQ(pieces, s) << s;
  }
}

TEST(SmolLM2Tokenizer, BytesWithoutTokensAreDropped) {
  // SmolLM2 has no token for bytes 0x04 or 0xFF (nor any token containing
  // them); its unknown token is the control token <|endoftext|>, which must
  // not appear inside text, so such bytes are dropped.
  const Tokenizer& t = model_tokenizer();
  const Ids ids = t.encode(
      "a\x04"
      "b\xFF"
      "c",
      false, false);
  EXPECT_EQ(t.decode(ids), "abc");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0);
}

TEST(SmolLM2Tokenizer, KnownIds) {
  // Ids confirmed with Hugging Face tokenizers (BPE over this file's vocab
  // and merges, Digits(individual) + ByteLevel pre-tokenizer).
  const Tokenizer& t = model_tokenizer();
  EXPECT_EQ(t.encode("Hello World! 12345", false, false),
            (Ids{19556, 2260, 17, 216, 33, 34, 35, 36, 37}));
  // Every digit is its own token in SmolLM2.
  const Ids digits = t.encode("9876543210", false, false);
  ASSERT_EQ(digits.size(), 10u);
  for (size_t i = 0; i < digits.size(); ++i) {
    EXPECT_EQ(t.token_to_piece(digits[i]), std::string(1, "9876543210"[i]));
  }
}

TEST(SmolLM2Tokenizer, ChatMlMarkersAreSingleTokens) {
  const Tokenizer& t = model_tokenizer();
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi there"}};
  const std::string prompt = format_chat(ChatFormat::kChatML, chat, /*add_assistant_header=*/true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "
            "there<|im_end|>\n<|im_start|>assistant\n");
  const Ids ids = t.encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
  EXPECT_EQ(t.decode(ids, /*render_special=*/true), prompt);
  EXPECT_EQ(t.decode(ids), "system\nBe brief.\nuser\nHi there\nassistant\n");
  // Each marker splits the text: "system\n" tokenizes as if on its own.
  const Ids system = t.encode("system\n", false, false);
  EXPECT_TRUE(std::equal(system.begin(), system.end(), ids.begin() + 1));

  // Without special parsing the markers are ordinary text.
  const Ids plain = t.encode(prompt, true, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(t.decode(plain), prompt);
}

TEST(SmolLM2Tokenizer, EncodesTenKilobytesInMilliseconds) {
  const Tokenizer& t = model_tokenizer();
  std::string text;
  const std::string para =
      "CacheBlend reuses the KV caches of retrieved chunks (about 15% of tokens are "
      "recomputed per layer) so that RAG answers start 2-3x sooner. In 2024, it ran on "
      "phones, Jetsons and laptops: 1,234 requests/s, naïve baseline = 100%.\n\n";
  while (text.size() < 10 * 1024) text += para;
  const Ids warm = t.encode(text, false, false);
  const int kRuns = 20;
  const auto start = std::chrono::steady_clock::now();
  size_t n_tokens = 0;
  for (int i = 0; i < kRuns; ++i) n_tokens += t.encode(text, false, false).size();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      kRuns;
  std::printf("[ info ] encode %zu bytes -> %zu tokens: %.3f ms (%.0f tokens/s)\n", text.size(),
              warm.size(), ms, static_cast<double>(n_tokens) / kRuns / (ms / 1000.0));
  EXPECT_EQ(t.decode(warm), text);
  // Generous enough for sanitizer builds; a quadratic merge loop misses it.
  EXPECT_LT(ms, 250.0);
}

TEST(SmolLM2Tokenizer, LongWordsStayFast) {
  // One 200 KB "word": BPE must not rescan the whole word per merge.
  const Tokenizer& t = model_tokenizer();
  const std::string word(200 * 1024, 'a');
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = t.encode(word, false, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(t.decode(ids), word);
  EXPECT_LT(ms, 2000.0);
}

TEST(SmolLM2Tokenizer, BadIdsThrow) {
  const Tokenizer& t = model_tokenizer();
  EXPECT_THROW(t.token_to_piece(-1), Error);
  EXPECT_THROW(t.token_to_piece(t.n_vocab()), Error);
  EXPECT_THROW(t.decode(Ids{5, 49152}), Error);
}

}  // namespace
}  // namespace cb
