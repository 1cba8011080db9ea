// UTF-8, read one way everywhere: the tokenizer's decoding, the C API's
// escaped messages and the samples' checks of text from files all take a
// character as Unicode's well-formed sequences (Table 3-7) define it: no
// overlong forms, no surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cb {

struct Utf8Char {
  // Valid: the sequence's length (1-4).  Invalid: the length of its longest
  // prefix that could still have begun a well-formed sequence, at least 1
  // (Unicode's "maximal subpart": the bytes one U+FFFD replaces).
  size_t len = 0;
  uint32_t cp = 0;  // the code point; 0 when invalid
  bool valid = false;
  // Invalid only because the text ends inside the sequence (a prefix that
  // more bytes could complete).
  bool truncated = false;
};

// The character at s[i]; i < s.size().
Utf8Char utf8_char(std::string_view s, size_t i) noexcept;

// C0 controls, DEL and C1 controls (U+0000-U+001F, U+007F-U+009F): the
// code points a terminal may act on, newline and tab among them.
constexpr bool is_control(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp < 0xA0);
}

// Appends the UTF-8 encoding of code point `cp` (<= U+10FFFF, no
// surrogate) to `out`.
void append_utf8(uint32_t cp, std::string& out);

}  // namespace cb
