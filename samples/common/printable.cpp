#include "printable.h"

#include "platform/utf8.h"

namespace cbs {

std::string printable(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    const cb::Utf8Char c = cb::utf8_char(text, i);
    if (c.valid && !cb::is_control(c.cp)) {
      out.append(text.substr(i, c.len));
      i += c.len;
    } else {
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
      ++i;
    }
  }
  return out;
}

}  // namespace cbs
