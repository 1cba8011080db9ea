// UTF-8 decoding and the few Unicode character classes the pre-tokenizers
// need (\p{L}, \p{N}, \p{P}, \s).  Text is decoded into "units": a code point
// for every valid UTF-8 sequence and one unit per byte that is not part of
// one, so any byte string survives pre-tokenization unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace cb::tok {

// Units at or above this value stand for a single invalid byte (base + byte).
inline constexpr uint32_t kInvalidByteUnit = 0x110000;

// Character class bits.  A unit with none of them set is "other" (symbols,
// marks, controls, unassigned code points, invalid bytes): it matches the
// regex class [^\s\p{L}\p{N}].
enum : uint8_t {
  kClassLetter = 1,       // \p{L}
  kClassNumber = 2,       // \p{N}
  kClassWhitespace = 4,   // \s (Unicode White_Space)
  kClassPunctuation = 8,  // \p{P}
};

struct DecodedText {
  std::vector<uint32_t> units;    // code points or kInvalidByteUnit + byte
  std::vector<uint32_t> offsets;  // byte offset of each unit, plus the end
  std::vector<uint8_t> classes;   // class bits of each unit
};

// Decodes `text` into `out` (reusing its storage).
void decode_utf8(std::string_view text, DecodedText& out);

uint8_t unit_class(uint32_t unit);

// GPT-2 byte-level mapping: every byte value gets a printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100 upwards), so
// byte-level BPE vocabularies can store arbitrary bytes as text.
uint32_t byte_to_unicode(uint8_t byte);
// The inverse; -1 for a code point that no byte maps to.
int unicode_to_byte(uint32_t cp);

}  // namespace cb::tok
