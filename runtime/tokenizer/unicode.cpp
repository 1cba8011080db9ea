#include "runtime/tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>

#include "platform/utf8.h"

namespace cb::tok {
namespace {

// Unicode White_Space (PropList.txt); fixed by the standard, so a list is
// clearer than a table lookup.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

uint8_t class_from_unicode(uint32_t cp) {
  uint8_t cls = is_white_space(cp) ? kClassWhitespace : 0;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      cls |= kClassLetter;
      break;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      cls |= kClassNumber;
      break;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      cls |= kClassPunctuation;
      break;
    default:
      break;
  }
  return cls;
}

// ASCII dominates real text; a table avoids the library call for it.
const std::array<uint8_t, 128>& ascii_classes() {
  static const std::array<uint8_t, 128> table = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = class_from_unicode(c);
    return t;
  }();
  return table;
}

struct ByteMaps {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // every mapped code point is < 256 + 68
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      m.to_unicode[b] = printable ? b : next++;
      m.to_byte[m.to_unicode[b]] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

}  // namespace

void decode_utf8(std::string_view text, DecodedText& out) {
  out.units.clear();
  out.offsets.clear();
  out.classes.clear();
  out.units.reserve(text.size());
  out.offsets.reserve(text.size() + 1);
  out.classes.reserve(text.size());
  const auto& ascii = ascii_classes();
  size_t i = 0;
  while (i < text.size()) {
    out.offsets.push_back(static_cast<uint32_t>(i));
    const auto b0 = static_cast<uint8_t>(text[i]);
    if (b0 < 0x80) {
      out.units.push_back(b0);
      out.classes.push_back(ascii[b0]);
      ++i;
      continue;
    }
    const Utf8Char c = utf8_char(text, i);
    if (!c.valid) {
      out.units.push_back(kInvalidByteUnit + b0);
      out.classes.push_back(0);
      ++i;
    } else {
      out.units.push_back(c.cp);
      out.classes.push_back(class_from_unicode(c.cp));
      i += c.len;
    }
  }
  out.offsets.push_back(static_cast<uint32_t>(text.size()));
}

uint8_t unit_class(uint32_t unit) {
  if (unit < 128) return ascii_classes()[unit];
  if (unit >= kInvalidByteUnit) return 0;
  return class_from_unicode(unit);
}

uint32_t byte_to_unicode(uint8_t byte) {
  return byte_maps().to_unicode[byte];
}

int unicode_to_byte(uint32_t cp) {
  const auto& m = byte_maps();
  return cp < m.to_byte.size() ? m.to_byte[cp] : -1;
}

}  // namespace cb::tok
