// platform/utf8: the decoder against the definition of the UTF-8 encoding
// form (an n-byte sequence encodes a scalar value in n's range by its bit
// layout), worked out by arithmetic on code point intervals rather than by
// the decoder's table of byte ranges.
#include "platform/utf8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace cb {
namespace {

// Whether b[0..k) begins the n-byte encoding of some Unicode scalar value
// (k <= n): the lead byte's marker, continuation markers, then the interval
// of code points whose encoding starts so, met with n's range less the
// surrogates.
bool begins_encoding(const std::string& b, size_t k, size_t n) {
  const auto at = [&](size_t j) { return static_cast<unsigned char>(b[j]); };
  const unsigned mask = n == 1 ? 0x80 : (0xFF80u >> n) & 0xFF;
  const unsigned mark = n == 1 ? 0x00 : (0xFF00u >> n) & 0xFF;
  if ((at(0) & mask) != mark) return false;
  uint64_t lo = at(0) & ~mask & 0xFF;
  for (size_t j = 1; j < k; ++j) {
    if ((at(j) & 0xC0) != 0x80) return false;
    lo = (lo << 6) | (at(j) & 0x3F);
  }
  const size_t free_bits = 6 * (n - k);
  lo <<= free_bits;
  const uint64_t hi = lo + (uint64_t{1} << free_bits) - 1;
  static constexpr uint64_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  static constexpr uint64_t kMax[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  const uint64_t a = std::max(lo, kMin[n]), z = std::min(hi, kMax[n]);
  return a <= z && !(a >= 0xD800 && z <= 0xDFFF);
}

// What utf8_char(b, 0) must give, by that definition.
Utf8Char expected(const std::string& b) {
  for (size_t n = 1; n <= 4 && n <= b.size(); ++n) {
    if (!begins_encoding(b, n, n)) continue;
    uint32_t cp = static_cast<unsigned char>(b[0]) & (n == 1 ? 0x7F : 0xFFu >> (n + 1));
    for (size_t j = 1; j < n; ++j) cp = (cp << 6) | (static_cast<unsigned char>(b[j]) & 0x3F);
    return Utf8Char{n, cp, true, false};
  }
  // The longest prefix that more bytes could complete, else one byte.
  size_t len = 1;
  bool completable = false;
  for (size_t k = 1; k <= std::min<size_t>(3, b.size()); ++k) {
    for (size_t n = k + 1; n <= 4; ++n) {
      if (begins_encoding(b, k, n)) {
        len = k;
        completable = true;
      }
    }
  }
  return Utf8Char{len, 0, false, completable && len == b.size()};
}

void expect_same(const Utf8Char& got, const Utf8Char& want, const std::string& b) {
  std::string hex;
  for (unsigned char c : b) {
    hex.push_back(' ');
    hex.append(std::to_string(c));
  }
  EXPECT_EQ(got.valid, want.valid) << "bytes" << hex;
  EXPECT_EQ(got.len, want.len) << "bytes" << hex;
  EXPECT_EQ(got.cp, want.cp) << "bytes" << hex;
  EXPECT_EQ(got.truncated, want.truncated) << "bytes" << hex;
}

TEST(Utf8, DecodesAsTheEncodingFormDefines) {
  // Every lead byte, followed by bytes at the edges of every range the
  // decoder distinguishes, in strings of 1 to 4 bytes.
  const std::vector<unsigned char> edges = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F,
                                            0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xF4, 0xFF};
  size_t valid = 0, truncated = 0, cases = 0;
  for (int b0 = 0; b0 < 256; ++b0) {
    std::string b(1, static_cast<char>(b0));
    for (unsigned char b1 : edges) {
      for (unsigned char b2 : edges) {
        for (unsigned char b3 : edges) {
          b.resize(1);
          for (unsigned char next : {b1, b2, b3}) {
            const Utf8Char want = expected(b);
            expect_same(utf8_char(b, 0), want, b);
            valid += want.valid;
            truncated += want.truncated;
            ++cases;
            b.push_back(static_cast<char>(next));
          }
          const Utf8Char want = expected(b);
          expect_same(utf8_char(b, 0), want, b);
          valid += want.valid;
          ++cases;
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
  // The oracle itself saw each kind of case.
  EXPECT_GT(valid, 0u);
  EXPECT_GT(truncated, 0u);
  EXPECT_GT(cases - valid - truncated, 0u);
}

TEST(Utf8, KnownSequences) {
  auto at0 = [](const char* s) { return utf8_char(s, 0); };
  EXPECT_EQ(at0("\xC3\xA9").cp, 0xE9u);
  EXPECT_EQ(at0("\xF0\x9F\x98\x80").cp, 0x1F600u);
  EXPECT_FALSE(at0("\xC0\x80").valid);  // overlong
  EXPECT_EQ(at0("\xC0\x80").len, 1u);
  EXPECT_FALSE(at0("\xED\xA0\x80").valid);  // a surrogate
  EXPECT_EQ(at0("\xED\xA0\x80").len, 1u);
  EXPECT_FALSE(at0("\xF4\x90\x80\x80").valid);  // above U+10FFFF
  EXPECT_TRUE(at0("\xE6\x97").truncated);       // cut short
  EXPECT_EQ(at0("\xE6\x97").len, 2u);
  EXPECT_FALSE(at0("\xE6\x97x").truncated);  // broken off
  EXPECT_EQ(at0("\xE6\x97x").len, 2u);
  EXPECT_FALSE(at0("\x80").valid);                       // a lone continuation
  EXPECT_EQ(utf8_char("x\xE2\x82\xAC", 1).cp, 0x20ACu);  // at an offset
  EXPECT_EQ(utf8_char("x\xE2\x82\xAC", 1).len, 3u);
}

TEST(Utf8, EveryScalarValueRoundTrips) {
  std::string s;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    s.clear();
    append_utf8(cp, s);
    const size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    ASSERT_EQ(s.size(), n) << cp;
    ASSERT_TRUE(begins_encoding(s, n, n)) << cp;
    const Utf8Char c = utf8_char(s, 0);
    ASSERT_TRUE(c.valid) << cp;
    ASSERT_EQ(c.len, n) << cp;
    ASSERT_EQ(c.cp, cp);
  }
}

TEST(Utf8, ControlsAreC0DelAndC1) {
  for (uint32_t cp = 0; cp < 0x200; ++cp) {
    EXPECT_EQ(is_control(cp), cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) << cp;
  }
  EXPECT_FALSE(is_control(0x2028));
}

}  // namespace
}  // namespace cb
