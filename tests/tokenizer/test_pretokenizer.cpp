// The pre-tokenizer splits, checked against the regex semantics they
// implement (expected words written out by hand from the regexes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/unicode.h"

namespace cb::tok {
namespace {

std::vector<std::string> words(const std::string& pre, std::string_view text) {
  const PreTokenizer p(pre_tokenizer_spec(pre).steps);
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  p.split(text, ranges);
  std::vector<std::string> out;
  size_t covered = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, covered) << "words must tile the text";
    EXPECT_LT(b, e) << "no empty words";
    covered = e;
    out.emplace_back(text.substr(b, e - b));
  }
  EXPECT_EQ(covered, text.size());
  return out;
}

using W = std::vector<std::string>;

TEST(PreTokenizerGpt2, LettersSpacesAndContractions) {
  EXPECT_EQ(words("gpt2", "Hello world's  end\n\n"),
            (W{"Hello", " world", "'s", " ", " end", "\n\n"}));
  // Contractions are case-sensitive in the GPT-2 regex.
  EXPECT_EQ(words("gpt2", "DON'T don't"), (W{"DON", "'", "T", " don", "'t"}));
  EXPECT_EQ(words("gpt2", "we're they've I'll"), (W{"we", "'re", " they", "'ve", " I", "'ll"}));
}

TEST(PreTokenizerGpt2, NumbersPunctuationAndWhitespaceRuns) {
  EXPECT_EQ(words("gpt2", "In 2024, $3.14!"), (W{"In", " 2024", ",", " $", "3", ".", "14", "!"}));
  // \s+(?!\S): the last space of a run joins the next word; a run at the
  // end of the text stays whole; a single tab before a word stands alone.
  EXPECT_EQ(words("gpt2", "a   b  "), (W{"a", "  ", " b", "  "}));
  EXPECT_EQ(words("gpt2", "a\tb"), (W{"a", "\t", "b"}));
  EXPECT_EQ(words("gpt2", "x \t\ty"), (W{"x", " \t", "\t", "y"}));
}

TEST(PreTokenizerGpt2, UnicodeClasses) {
  // Letters with accents, CJK (letters), U+3000 (whitespace), ² (a number).
  EXPECT_EQ(words("gpt2", "Café 日本\u3000x²"), (W{"Café", " 日本", "\u3000", "x", "²"}));
  // Emoji are "other": a run of them, with an optional leading space.
  EXPECT_EQ(words("gpt2", "hi 😀😀!"), (W{"hi", " 😀😀!"}));
}

TEST(PreTokenizerGpt2, InvalidUtf8BytesAreOtherCharacters) {
  EXPECT_EQ(words("gpt2",
                  "ab\xFF"
                  "cd"),
            (W{"ab", "\xFF", "cd"}));
  EXPECT_EQ(words("gpt2", "a \xC3\x28"), (W{
                                             "a",
                                             " \xC3(",
                                         }));
  // A truncated sequence at the end.
  EXPECT_EQ(words("gpt2", "x\xE6\x97"), (W{"x", "\xE6\x97"}));
}

TEST(PreTokenizerSmollm, DigitsAreSplitFirst) {
  EXPECT_EQ(words("smollm", "abc 123"), (W{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(words("smollm", "v2.0"), (W{"v", "2", ".", "0"}));
  // The digit split ends the piece, so "  " before a digit stays together.
  EXPECT_EQ(words("smollm", "a  1"), (W{"a", "  ", "1"}));
}

TEST(PreTokenizerLlama3, Rules) {
  EXPECT_EQ(words("llama3", "DON'T stop"), (W{"DON", "'T", " stop"}));
  EXPECT_EQ(words("llama3", "1234567"), (W{"123", "456", "7"}));
  EXPECT_EQ(words("llama3", "a\n\n b"), (W{"a", "\n\n", " b"}));
  EXPECT_EQ(words("llama3", "hello!!\n\nx"), (W{"hello", "!!\n\n", "x"}));
  // [^\r\n\p{L}\p{N}]?\p{L}+ lets punctuation lead a word.
  EXPECT_EQ(words("llama3", "(hello) 42"), (W{"(hello", ")", " ", "42"}));
  EXPECT_EQ(words("llama-bpe", "  \t\n  x"), (W{"  \t\n", " ", " x"}));
}

TEST(PreTokenizerQwen2, Llama3RulesWithSingleDigits) {
  EXPECT_EQ(words("qwen2", "1234567"), (W{"1", "2", "3", "4", "5", "6", "7"}));
  EXPECT_EQ(words("qwen2", "DON'T stop"), (W{"DON", "'T", " stop"}));
  EXPECT_EQ(words("qwen2", "(hello) 42"), (W{"(hello", ")", " ", "4", "2"}));
  // One regex over the whole text: the spaces before a digit are matched
  // as Llama 3 matches them (a number split off first would end the run).
  EXPECT_EQ(words("qwen2", "a  1"), (W{"a", " ", " ", "1"}));
  EXPECT_EQ(words("llama3", "a  1"), (W{"a", " ", " ", "1"}));
  EXPECT_FALSE(pre_tokenizer_spec("qwen2").ignore_merges);
  EXPECT_FALSE(pre_tokenizer_spec("qwen2").add_bos_default);
}

TEST(PreTokenizerDefault, LlamaCppDefaultSequence) {
  EXPECT_EQ(words("default", "a+b=12345"), (W{"a", "+", "b", "=", "123", "45"}));
  EXPECT_EQ(words("default", "x, y"), (W{"x", ",", " y"}));
}

TEST(PreTokenizerSpec, NamesAndErrors) {
  EXPECT_TRUE(pre_tokenizer_spec("llama-bpe").ignore_merges);
  EXPECT_TRUE(pre_tokenizer_spec("llama3").add_bos_default);
  EXPECT_FALSE(pre_tokenizer_spec("smollm").ignore_merges);
  EXPECT_FALSE(pre_tokenizer_spec("smollm").add_bos_default);
  try {
    pre_tokenizer_spec("no-such-pre");
    FAIL() << "unknown pre-tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos);
  }
}

TEST(Utf8, ByteMappingIsABijectionOntoPrintableCharacters) {
  std::vector<bool> seen(324, false);
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
    ASSERT_LT(cp, seen.size());
    EXPECT_FALSE(seen[cp]);
    seen[cp] = true;
    EXPECT_EQ(unicode_to_byte(cp), b);
    EXPECT_EQ(unit_class(cp) & kClassWhitespace, 0) << "byte " << b << " maps to whitespace";
  }
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // the familiar "Ġ"
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(byte_to_unicode('a'), static_cast<uint32_t>('a'));
}

// Long text is split in windows cut at PreTokenizer::next_cut: at every cut
// it finds, each pre-tokenizer splits the two sides into the words of the
// whole.  The text has what could join words across a line break:
// whitespace runs, punctuation before breaks, CRLF, contractions, digits, a
// no-break space, invalid bytes.
TEST(PreTokenizerWindows, CutsNeverChangeTheWords) {
  const std::string text =
      "Hello world.\nThe  quick\n  brown fox\n\nJumps\t\nover 123456 lazy\r\nDogs;\ndon't\nIt's "
      "fine,\nOK\n\xc2\xa0\nNbsp\n\xff\nBad\nx\ny \nZ!!\nA1\n234\nEnd.\n\nNew paragraph\n";
  for (const char* pre : {"smollm", "gpt2", "llama3", "qwen2", "default"}) {
    const W whole = words(pre, text);
    size_t cuts = 0;
    for (size_t from = 0; from < text.size(); ++from) {
      const size_t cut = PreTokenizer::next_cut(text, from);
      if (cut == text.size()) break;
      ASSERT_GE(cut, from);
      W pieces = words(pre, std::string_view(text).substr(0, cut));
      const W rest = words(pre, std::string_view(text).substr(cut));
      pieces.insert(pieces.end(), rest.begin(), rest.end());
      EXPECT_EQ(pieces, whole) << pre << ", cut at " << cut;
      from = cut;
      ++cuts;
    }
    EXPECT_GE(cuts, 8u) << pre;
  }
  EXPECT_EQ(PreTokenizer::next_cut("no line break here", 0), 18u);
  EXPECT_EQ(PreTokenizer::next_cut("a \nb", 0), 4u) << "a space before the break: no cut";
  EXPECT_EQ(PreTokenizer::next_cut("a.\nb", 0), 3u);
}

}  // namespace
}  // namespace cb::tok
