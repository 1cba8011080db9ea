#include "platform/utf8.h"

namespace cb {

Utf8Char utf8_char(std::string_view s, size_t i) noexcept {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return Utf8Char{1, b0, true, false};
  // Continuation bytes after the lead, and the range of the first of them
  // (the others are all 80-BF): Table 3-7 of the Unicode standard.
  size_t more = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    more = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    more = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    more = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return Utf8Char{1, 0, false, false};  // a continuation byte, C0, C1 or F5-FF
  }
  for (size_t k = 1; k <= more; ++k) {
    if (i + k >= s.size()) return Utf8Char{k, 0, false, true};
    const unsigned char b = byte(i + k);
    const bool in_range = k == 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xBF;
    if (!in_range) return Utf8Char{k, 0, false, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return Utf8Char{more + 1, cp, true, false};
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace cb
