#include "text_chars.h"

#include <array>

#include "platform/utf8.h"

namespace rag::text {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

bool is_ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool is_ascii_alnum(char c) {
  return is_ascii_alpha(c) || (c >= '0' && c <= '9');
}

char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

std::string_view trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string collapse_spaces(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : trim(s)) {
    if (is_space(c)) {
      space = true;
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

namespace {

// Windows-1252's characters at 0x80..0x9F (0: undefined there), which both
// legacy HTML pages and numeric references in that range mean.
constexpr std::array<uint16_t, 32> kCp1252High = {
    0x20AC, 0,      0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0,      0x017D, 0,      0,      0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0,      0x017E, 0x0178};

}  // namespace

size_t valid_utf8_prefix(std::string_view s, bool cut_ok) {
  size_t i = 0;
  while (i < s.size()) {
    const cb::Utf8Char c = cb::utf8_char(s, i);
    if (!c.valid) return c.truncated && cut_ok ? s.size() : i;
    i += c.len;
  }
  return i;
}

uint16_t cp1252_high(unsigned char c) {
  return c >= 0x80 && c < 0xA0 ? kCp1252High[c - 0x80] : 0;
}

std::string cp1252_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out += ch;
    } else if (c < 0xA0) {
      const uint16_t cp = cp1252_high(c);
      cb::append_utf8(cp != 0 ? cp : 0xFFFD, out);
    } else {
      cb::append_utf8(c, out);
    }
  }
  return out;
}

}  // namespace rag::text
