#include "printable.h"

namespace cbs {
namespace {

// The length of the well-formed UTF-8 sequence of 2-4 bytes at text[i] (no
// overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char b = at(0);
  size_t len = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
  }
  if (len == 0 || i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((at(k) & 0xC0) != 0x80) return 0;
  if ((b == 0xE0 && at(1) < 0xA0) || (b == 0xED && at(1) > 0x9F) || (b == 0xF0 && at(1) < 0x90) ||
      (b == 0xF4 && at(1) > 0x8F))
    return 0;
  return len;
}

}  // namespace

std::string printable(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    size_t seq = b >= 0x80 ? utf8_sequence(text, i) : 0;
    // U+0080..U+009F (C2 80..C2 9F): the C1 controls, CSI among them.
    if (seq == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) seq = 0;
    if (seq > 0) {
      out.append(text.substr(i, seq));
      i += seq;
    } else if (b >= 0x20 && b < 0x7F) {
      out.push_back(static_cast<char>(b));
      ++i;
    } else {
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
      ++i;
    }
  }
  return out;
}

}  // namespace cbs
