// Character helpers of the text extractors: ASCII classes, whitespace,
// UTF-8 validity, Windows-1252 to UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rag::text {

bool is_space(char c);  // ASCII whitespace
bool is_ascii_alpha(char c);
bool is_ascii_alnum(char c);
char ascii_lower(char c);
std::string lower(std::string_view s);  // ASCII letters only
std::string_view trim(std::string_view s);
// Runs of whitespace as one space, none at the ends: a one-line title.
std::string collapse_spaces(std::string_view s);
// The length of the valid UTF-8 prefix of s; `cut_ok`: a sequence that the
// end of s cuts short counts as valid.
size_t valid_utf8_prefix(std::string_view s, bool cut_ok);
// Windows-1252's character at byte c in 0x80..0x9F (which legacy pages and
// numeric references in that range mean); 0 where it has none.
uint16_t cp1252_high(unsigned char c);
// Legacy single-byte text (Windows-1252, a superset of Latin-1) as UTF-8.
std::string cp1252_to_utf8(std::string_view s);

}  // namespace rag::text
