#include "text_extract.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#ifdef CB_HAVE_POPPLER
#include <poppler/cpp/poppler-document.h>
#include <poppler/cpp/poppler-global.h>
#include <poppler/cpp/poppler-page.h>
#include <poppler/cpp/poppler-version.h>
#endif

namespace rag {
namespace {

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

// Runs of whitespace as one space, none at the ends: a one-line title.
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

bool is_blank(std::string_view s) {
  return trim(s).empty();
}

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string too_much_text(const char* what, uint64_t max_bytes) {
  return std::string(what) + " more than the " + megabytes(max_bytes) +
         " a file may have (--max-file-mb)";
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Windows-1252's characters at 0x80..0x9F (0: undefined there), which both
// legacy HTML pages and numeric references in that range mean.
constexpr std::array<uint16_t, 32> kCp1252High = {
    0x20AC, 0,      0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0,      0x017D, 0,      0,      0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0,      0x017E, 0x0178};

// The length of the valid UTF-8 prefix of s; `cut_ok`: a sequence that the
// end of s cuts short counts as valid.
size_t valid_utf8_prefix(std::string_view s, bool cut_ok) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000;
    } else {
      return i;
    }
    uint32_t cp = c & (0x7Fu >> len);
    size_t k = 1;
    for (; k < len && i + k < s.size(); ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (k < len) return cut_ok ? s.size() : i;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return i;
}

// Legacy single-byte text (Windows-1252, a superset of Latin-1) as UTF-8.
std::string cp1252_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out += ch;
    } else if (c < 0xA0) {
      const uint16_t cp = kCp1252High[c - 0x80];
      append_utf8(out, cp != 0 ? cp : 0xFFFD);
    } else {
      append_utf8(out, c);
    }
  }
  return out;
}

// The name's last component and its extension (lowercase, with the dot;
// empty for none, and for a name that only starts with a dot).
std::string base_name(const std::string& file_name) {
  const size_t slash = file_name.find_last_of('/');
  return slash == std::string::npos ? file_name : file_name.substr(slash + 1);
}

std::string extension_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? std::string() : lower(name.substr(dot));
}

std::string stem_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

// A Markdown text's first "# " heading, else `fallback`.
std::string first_heading(std::string_view text, const std::string& fallback) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (line.starts_with("# ")) {
      const std::string t = collapse_spaces(line.substr(2));
      if (!t.empty()) return t;
    }
    start = end + 1;
  }
  return fallback;
}

// ---------------------------------------------------------------- HTML

struct NamedEntity {
  const char* name;
  uint32_t cp;
};

// The references that real pages use; others stay as written.
constexpr NamedEntity kEntities[] = {
    {"amp", '&'},       {"lt", '<'},        {"gt", '>'},        {"quot", '"'},
    {"apos", '\''},     {"nbsp", ' '},      {"ensp", ' '},      {"emsp", ' '},
    {"thinsp", ' '},    {"shy", 0xAD},      {"copy", 0xA9},     {"reg", 0xAE},
    {"trade", 0x2122},  {"hellip", 0x2026}, {"mdash", 0x2014},  {"ndash", 0x2013},
    {"minus", 0x2212},  {"lsquo", 0x2018},  {"rsquo", 0x2019},  {"sbquo", 0x201A},
    {"ldquo", 0x201C},  {"rdquo", 0x201D},  {"bdquo", 0x201E},  {"laquo", 0xAB},
    {"raquo", 0xBB},    {"lsaquo", 0x2039}, {"rsaquo", 0x203A}, {"bull", 0x2022},
    {"middot", 0xB7},   {"deg", 0xB0},      {"times", 0xD7},    {"divide", 0xF7},
    {"plusmn", 0xB1},   {"micro", 0xB5},    {"para", 0xB6},     {"sect", 0xA7},
    {"euro", 0x20AC},   {"pound", 0xA3},    {"yen", 0xA5},      {"cent", 0xA2},
    {"curren", 0xA4},   {"frac12", 0xBD},   {"frac14", 0xBC},   {"frac34", 0xBE},
    {"sup1", 0xB9},     {"sup2", 0xB2},     {"sup3", 0xB3},     {"iexcl", 0xA1},
    {"iquest", 0xBF},   {"larr", 0x2190},   {"rarr", 0x2192},   {"uarr", 0x2191},
    {"darr", 0x2193},   {"harr", 0x2194},   {"rArr", 0x21D2},   {"le", 0x2264},
    {"ge", 0x2265},     {"ne", 0x2260},     {"asymp", 0x2248},  {"infin", 0x221E},
    {"dagger", 0x2020}, {"Dagger", 0x2021}, {"permil", 0x2030}, {"prime", 0x2032},
    {"Agrave", 0xC0},   {"Aacute", 0xC1},   {"Acirc", 0xC2},    {"Atilde", 0xC3},
    {"Auml", 0xC4},     {"Aring", 0xC5},    {"AElig", 0xC6},    {"Ccedil", 0xC7},
    {"Egrave", 0xC8},   {"Eacute", 0xC9},   {"Ecirc", 0xCA},    {"Euml", 0xCB},
    {"Igrave", 0xCC},   {"Iacute", 0xCD},   {"Icirc", 0xCE},    {"Iuml", 0xCF},
    {"ETH", 0xD0},      {"Ntilde", 0xD1},   {"Ograve", 0xD2},   {"Oacute", 0xD3},
    {"Ocirc", 0xD4},    {"Otilde", 0xD5},   {"Ouml", 0xD6},     {"Oslash", 0xD8},
    {"Ugrave", 0xD9},   {"Uacute", 0xDA},   {"Ucirc", 0xDB},    {"Uuml", 0xDC},
    {"Yacute", 0xDD},   {"THORN", 0xDE},    {"szlig", 0xDF},    {"agrave", 0xE0},
    {"aacute", 0xE1},   {"acirc", 0xE2},    {"atilde", 0xE3},   {"auml", 0xE4},
    {"aring", 0xE5},    {"aelig", 0xE6},    {"ccedil", 0xE7},   {"egrave", 0xE8},
    {"eacute", 0xE9},   {"ecirc", 0xEA},    {"euml", 0xEB},     {"igrave", 0xEC},
    {"iacute", 0xED},   {"icirc", 0xEE},    {"iuml", 0xEF},     {"eth", 0xF0},
    {"ntilde", 0xF1},   {"ograve", 0xF2},   {"oacute", 0xF3},   {"ocirc", 0xF4},
    {"otilde", 0xF5},   {"ouml", 0xF6},     {"oslash", 0xF8},   {"ugrave", 0xF9},
    {"uacute", 0xFA},   {"ucirc", 0xFB},    {"uuml", 0xFC},     {"yacute", 0xFD},
    {"thorn", 0xFE},    {"yuml", 0xFF},     {"OElig", 0x152},   {"oelig", 0x153},
    {"Scaron", 0x160},  {"scaron", 0x161},  {"Yuml", 0x178},    {"alpha", 0x3B1},
    {"beta", 0x3B2},    {"gamma", 0x3B3},   {"delta", 0x3B4},   {"pi", 0x3C0},
    {"sigma", 0x3C3},   {"mu", 0x3BC},      {"lambda", 0x3BB},  {"Omega", 0x3A9},
};

// Character references decoded: the named ones above (with their ';'), and
// numeric ones (&#65; &#x41;, the ';' optional); code points that are not
// characters become U+FFFD.  Anything else, a lone '&' included, stays.
std::string decode_entities(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    if (i + 1 < s.size() && s[i + 1] == '#') {
      size_t k = i + 2;
      const bool hex = k < s.size() && (s[k] == 'x' || s[k] == 'X');
      if (hex) ++k;
      const size_t digits_start = k;
      uint32_t cp = 0;
      for (; k < s.size(); ++k) {
        const char c = s[k];
        int d = -1;
        if (c >= '0' && c <= '9') {
          d = c - '0';
        } else if (hex && c >= 'a' && c <= 'f') {
          d = c - 'a' + 10;
        } else if (hex && c >= 'A' && c <= 'F') {
          d = c - 'A' + 10;
        }
        if (d < 0) break;
        cp = cp > 0x10FFFF ? cp : cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);
      }
      if (k == digits_start) {
        out += '&';
        continue;
      }
      if (k < s.size() && s[k] == ';') ++k;
      if (cp >= 0x80 && cp < 0xA0 && kCp1252High[cp - 0x80] != 0) cp = kCp1252High[cp - 0x80];
      if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
      append_utf8(out, cp);
      i = k - 1;
      continue;
    }
    size_t k = i + 1;
    while (k < s.size() && k - i <= 8 && is_ascii_alnum(s[k])) ++k;
    bool found = false;
    if (k < s.size() && s[k] == ';' && k > i + 1) {
      const std::string_view name = s.substr(i + 1, k - i - 1);
      for (const NamedEntity& e : kEntities) {
        if (name == e.name) {
          append_utf8(out, e.cp);
          i = k;
          found = true;
          break;
        }
      }
    }
    if (!found) out += '&';
  }
  return out;
}

// The text being built from an HTML page: runs of whitespace collapse to one
// space (except in <pre>), and line and paragraph breaks never pile up.
class HtmlText {
 public:
  void text(std::string_view s, bool pre) {
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (pre) {  // kept as laid out, but for control characters
        if (c == '\n' || c == '\t' || (u >= 0x20 && u != 0x7F)) out_ += c;
        continue;
      }
      if (is_space(c)) {
        space_ = true;
        continue;
      }
      if (u < 0x20 || u == 0x7F) continue;  // control characters carry no text
      if (space_ && !out_.empty() && out_.back() != '\n' && out_.back() != ' ') out_ += ' ';
      space_ = false;
      out_ += c;
    }
  }
  void raw(std::string_view s) {
    out_ += s;
    space_ = false;
  }
  void space() { space_ = true; }
  void line_break() {
    while (!out_.empty() && (out_.back() == ' ' || out_.back() == '\t')) out_.pop_back();
    if (!out_.empty() && out_.back() != '\n') out_ += '\n';
    space_ = false;
  }
  void paragraph_break() {
    line_break();
    if (!out_.empty() && (out_.size() < 2 || out_[out_.size() - 2] != '\n')) out_ += '\n';
  }
  bool at_line_start() const { return out_.empty() || out_.back() == '\n'; }
  std::string& str() { return out_; }

 private:
  std::string out_;
  bool space_ = false;
};

enum class Block { kNone, kLine, kParagraph };

Block block_kind(const std::string& tag) {
  static const char* const kParagraphs[] = {
      "p",       "section", "article",  "header",   "footer",     "nav",    "main",
      "aside",   "table",   "ul",       "ol",       "dl",         "figure", "figcaption",
      "address", "form",    "fieldset", "details",  "blockquote", "hr",     "center",
      "body",    "html",    "menu",     "noscript", "caption"};
  static const char* const kLines[] = {"div", "br", "li", "tr", "dt", "dd", "summary", "option"};
  for (const char* t : kParagraphs)
    if (tag == t) return Block::kParagraph;
  for (const char* t : kLines)
    if (tag == t) return Block::kLine;
  return Block::kNone;
}

int heading_tag_level(const std::string& tag) {
  return tag.size() == 2 && tag[0] == 'h' && tag[1] >= '1' && tag[1] <= '6' ? tag[1] - '0' : 0;
}

// Case-insensitive search for `needle` (lowercase) in s from `from`.
size_t find_ci(std::string_view s, std::string_view needle, size_t from) {
  if (needle.size() > s.size()) return std::string_view::npos;
  for (size_t i = from; i + needle.size() <= s.size(); ++i) {
    size_t k = 0;
    while (k < needle.size() && ascii_lower(s[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return i;
  }
  return std::string_view::npos;
}

// Where tags end in an HTML text.  Quoted attribute values may hold '>'.
// Malformed markup could make the quote-aware scan read the rest of the
// page for every '<' (quadratic time), so it has a budget of a few times the
// page's length, after which a tag ends at the first '>'.
class TagEnds {
 public:
  explicit TagEnds(std::string_view s)
      : s_(s), last_gt_(s.rfind('>')), budget_(4 * s.size() + (size_t{1} << 20)) {}

  // One past the '>' that ends the tag whose name ends at `k`; npos when no
  // '>' does.
  size_t after(size_t k) {
    if (last_gt_ == std::string_view::npos || k > last_gt_) return std::string_view::npos;
    if (budget_ > 0) {
      const size_t end = quote_aware(k);
      if (end != std::string_view::npos) return end;
    }
    return s_.find('>', k) + 1;  // an unclosed quote: the first '>' ends it after all
  }

 private:
  size_t quote_aware(size_t k) {
    char quote = 0;
    char last = 0;  // the last non-space character outside quotes
    for (size_t i = k; i < s_.size(); ++i) {
      if (budget_ == 0) return std::string_view::npos;
      --budget_;
      const char c = s_[i];
      if (quote != 0) {
        if (c == quote) quote = 0;
        continue;
      }
      if (c == '>') return i + 1;
      if ((c == '"' || c == '\'') && last == '=') {
        quote = c;
      } else if (!is_space(c)) {
        last = c;
      }
    }
    return std::string_view::npos;
  }
  std::string_view s_;
  size_t last_gt_;
  size_t budget_;
};

// Headings longer than this are not headings but text in an unclosed <hN>.
constexpr size_t kMaxHeadingBytes = 200;

}  // namespace

std::string html_to_text(std::string_view html_in, std::string* title) {
  // Pages without a valid UTF-8 encoding are, in practice, Windows-1252.
  std::string transcoded;
  std::string_view html = html_in;
  if (valid_utf8_prefix(html_in, false) != html_in.size()) {
    transcoded = cp1252_to_utf8(html_in);
    html = transcoded;
  }
  HtmlText out;
  TagEnds tag_ends(html);
  std::string page_title, first_h1;
  bool have_title = false, in_head = false;
  int pre_depth = 0;
  int heading = 0;           // the open <hN>'s level, 0: none
  size_t heading_start = 0;  // where its text begins in the output

  const auto close_heading = [&] {
    if (heading == 0) return;
    std::string& s = out.str();
    const std::string text = collapse_spaces(std::string_view(s).substr(heading_start));
    s.resize(heading_start);
    if (text.size() > kMaxHeadingBytes) {
      out.text(text, false);
    } else if (!text.empty()) {
      out.raw(std::string(static_cast<size_t>(heading), '#') + " " + text);
      if (heading == 1 && first_h1.empty()) first_h1 = text;
    }
    heading = 0;
    out.paragraph_break();
  };
  const auto emit_text = [&](std::string_view raw) {
    if (raw.empty() || in_head) return;
    out.text(decode_entities(raw), pre_depth > 0 && heading == 0);
  };

  size_t i = 0;
  const size_t n = html.size();
  while (i < n) {
    const size_t lt = html.find('<', i);
    if (lt == std::string_view::npos) {
      emit_text(html.substr(i));
      break;
    }
    emit_text(html.substr(i, lt - i));
    i = lt;
    const char next = lt + 1 < n ? html[lt + 1] : '\0';
    if (html.substr(lt, 4) == "<!--") {  // a comment; unclosed, it runs to the end
      const size_t end = html.find("-->", lt + 4);
      i = end == std::string_view::npos ? n : end + 3;
      continue;
    }
    if (next == '!' || next == '?') {  // <!DOCTYPE ...>, <![CDATA[...]]>, <?xml ...?>
      const size_t end = html.find('>', lt + 2);
      i = end == std::string_view::npos ? n : end + 1;
      continue;
    }
    const bool closing = next == '/';
    const size_t name_start = lt + (closing ? 2 : 1);
    if (name_start >= n || !is_ascii_alpha(html[name_start])) {
      emit_text("<");  // a '<' that starts no tag is text ("a < b")
      i = lt + 1;
      continue;
    }
    size_t k = name_start;
    while (k < n && (is_ascii_alnum(html[k]) || html[k] == '-' || html[k] == ':')) ++k;
    const std::string tag = lower(html.substr(name_start, k - name_start));
    const size_t end = tag_ends.after(k);
    if (end == std::string_view::npos) {
      emit_text("<");
      i = lt + 1;
      continue;
    }
    i = end;

    if (!closing && (tag == "script" || tag == "style" || tag == "title" || tag == "textarea")) {
      // Raw text up to the closing tag (none: to the end).
      const size_t close = find_ci(html, "</" + tag, i);
      const std::string_view content =
          html.substr(i, close == std::string_view::npos ? n - i : close - i);
      i = close == std::string_view::npos ? n : tag_ends.after(close + 2 + tag.size());
      if (i == std::string_view::npos) i = n;
      if (tag == "title" && !have_title) {
        page_title = collapse_spaces(decode_entities(content));
        have_title = !page_title.empty();
      } else if (tag == "textarea") {
        emit_text(content);
      }
      continue;
    }
    if (tag == "head") {
      in_head = !closing;
      continue;
    }
    const int level = heading_tag_level(tag);
    const Block block = block_kind(tag);
    if (level == 0 && block == Block::kNone && tag != "pre" && tag != "td" && tag != "th") continue;
    in_head = false;  // body content: the head ended without its closing tag
    if (level > 0) {
      close_heading();
      if (!closing) {
        out.paragraph_break();
        heading = level;
        heading_start = out.str().size();
      }
      continue;
    }
    if (heading > 0) {
      // Inside a heading a line break is a space; any other block ends it.
      if (tag == "br") {
        out.space();
        continue;
      }
      close_heading();
    }
    if (tag == "pre") {
      out.paragraph_break();
      if (!closing) {
        ++pre_depth;
        if (i < n && html[i] == '\n') ++i;  // the newline right after <pre> is not text
      } else if (pre_depth > 0) {
        --pre_depth;
      }
      continue;
    }
    if (tag == "td" || tag == "th") {
      if (!closing && !out.at_line_start()) out.raw(" | ");
      continue;
    }
    if (block == Block::kParagraph) {
      out.paragraph_break();
    } else {
      out.line_break();
    }
    if (tag == "li" && !closing) out.raw("- ");
  }
  close_heading();
  if (title != nullptr) *title = have_title ? page_title : first_h1;
  std::string text(trim(out.str()));
  if (!text.empty()) text += '\n';
  return text;
}

// ---------------------------------------------------------------- reStructuredText

namespace {

// The number of characters (code points) of a UTF-8 string.
size_t display_width(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

// An adornment line: one punctuation character repeated (at least twice),
// from the first column; its character, else 0.
char adornment_char(std::string_view line) {
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
    line.remove_suffix(1);
  if (line.size() < 2) return 0;
  const char c = line[0];
  if (!std::strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", c) || c == '\0') return 0;
  for (char d : line)
    if (d != c) return 0;
  return c;
}

size_t adornment_length(std::string_view line) {
  return trim(line).size();
}

}  // namespace

std::string rst_to_markdown(std::string_view rst, std::string* title) {
  std::vector<std::string_view> lines;
  for (size_t start = 0; start <= rst.size();) {
    size_t end = rst.find('\n', start);
    if (end == std::string_view::npos) end = rst.size();
    std::string_view line = rst.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  // Section levels in the order their styles first appear, as docutils does.
  std::vector<std::pair<char, bool>> styles;  // (character, overlined)
  std::string out, first;
  const auto heading = [&](char c, bool over, std::string_view text) {
    const std::pair<char, bool> style{c, over};
    auto it = std::find(styles.begin(), styles.end(), style);
    if (it == styles.end()) it = styles.insert(styles.end(), style);
    const size_t level = std::min<size_t>(6, static_cast<size_t>(it - styles.begin()) + 1);
    const std::string t = collapse_spaces(text);
    if (first.empty()) first = t;
    if (!out.empty() && !out.ends_with("\n\n")) out += out.ends_with('\n') ? "\n" : "\n\n";
    out += std::string(level, '#') + " " + t + "\n";
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool after_blank = i == 0 || is_blank(lines[i - 1]);
    const char over = adornment_char(lines[i]);
    // Overline, title (which may be inset), underline of the same character.
    if (over != 0 && after_blank && i + 2 < lines.size() && !is_blank(lines[i + 1]) &&
        adornment_char(lines[i + 1]) == 0 && adornment_char(lines[i + 2]) == over &&
        adornment_length(lines[i]) >= display_width(trim(lines[i + 1])) &&
        adornment_length(lines[i + 2]) >= display_width(trim(lines[i + 1]))) {
      heading(over, true, lines[i + 1]);
      i += 2;
      if (i + 1 < lines.size() && !is_blank(lines[i + 1])) out += '\n';
      continue;
    }
    // Title from the first column, underlined at least as far as it reaches.
    if (after_blank && over == 0 && !is_blank(lines[i]) && !is_space(lines[i][0]) &&
        i + 1 < lines.size() && adornment_char(lines[i + 1]) != 0 &&
        adornment_length(lines[i + 1]) >= display_width(trim(lines[i]))) {
      heading(adornment_char(lines[i + 1]), false, lines[i]);
      i += 1;
      if (i + 1 < lines.size() && !is_blank(lines[i + 1])) out += '\n';
      continue;
    }
    out += lines[i];
    if (i + 1 < lines.size()) out += '\n';
  }
  if (title != nullptr) *title = first;
  return out;
}

// ---------------------------------------------------------------- gzip

std::optional<std::string> gunzip(std::string_view data, uint64_t max_bytes, std::string* error) {
  const auto fail = [&](std::string why) -> std::optional<std::string> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  if (data.size() < 2 || static_cast<unsigned char>(data[0]) != 0x1F ||
      static_cast<unsigned char>(data[1]) != 0x8B)
    return fail("not gzip data");
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return fail("zlib cannot start inflating");
  const std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);
  std::string out;
  std::vector<unsigned char> buf(1 << 16);
  size_t fed = 0;  // bytes of `data` handed to zlib so far
  const auto feed = [&] {
    const size_t n = std::min<size_t>(data.size() - fed, size_t{1} << 30);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + fed));
    zs.avail_in = static_cast<uInt>(n);
    fed += n;
  };
  feed();
  for (;;) {
    zs.next_out = buf.data();
    zs.avail_out = static_cast<uInt>(buf.size());
    const int r = inflate(&zs, Z_NO_FLUSH);
    const size_t produced = buf.size() - zs.avail_out;
    if (out.size() + produced > max_bytes)
      return fail(too_much_text("decompresses to", max_bytes) + ", so it is not loaded");
    out.append(reinterpret_cast<const char*>(buf.data()), produced);
    const size_t left = zs.avail_in + (data.size() - fed);  // input not yet inflated
    if (r == Z_STREAM_END) {
      // Another member may follow (gzip files can be concatenated); other
      // trailing bytes (padding) are ignored, as gzip itself does.
      const size_t at = data.size() - left;
      if (left < 2 || static_cast<unsigned char>(data[at]) != 0x1F ||
          static_cast<unsigned char>(data[at + 1]) != 0x8B)
        break;
      if (inflateReset(&zs) != Z_OK) return fail("zlib cannot start the next member");
      continue;
    }
    if (r == Z_BUF_ERROR || (r == Z_OK && produced == 0 && zs.avail_in == 0)) {
      if (left == 0) return fail("truncated gzip data");
      if (zs.avail_in == 0) feed();
      continue;
    }
    if (r != Z_OK)
      return fail(std::string("corrupt gzip data") +
                  (zs.msg != nullptr ? " (" + std::string(zs.msg) + ")" : ""));
    if (zs.avail_in == 0 && fed < data.size()) feed();
  }
  return out;
}

// ---------------------------------------------------------------- PDF

#ifdef CB_HAVE_POPPLER
namespace {

// Poppler reports problems through a global callback (by default onto
// stderr); ingest gives them as the file's skip reason instead.
std::string& poppler_last_error() {
  static std::string last;
  return last;
}

void keep_poppler_error(const std::string& message, void*) {
  poppler_last_error() = message;
}

// A page's text with each line's runs of blanks as one space and no blank
// ends: the layout's column padding means nothing to retrieval.
std::string tidy_page_text(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\r') continue;
    if (c == '\n' || c == '\f') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      out += '\n';
      space = false;
    } else if (c == ' ' || c == '\t' || c == '\v') {
      space = true;
    } else {
      if (space && !out.empty() && out.back() != '\n') out += ' ';
      space = false;
      out += c;
    }
  }
  return std::string(trim(out));
}

ExtractedText pdf_text(std::string_view bytes, uint64_t max_bytes, const std::string& stem) {
  ExtractedText r;
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    r.skipped = "a PDF file too large for the PDF reader";
    return r;
  }
  poppler::set_debug_error_function(keep_poppler_error, nullptr);
  poppler_last_error().clear();
  const std::unique_ptr<poppler::document> doc(
      poppler::document::load_from_raw_data(bytes.data(), static_cast<int>(bytes.size())));
  if (!doc) {
    const std::string& why = poppler_last_error();
    r.skipped = "not a readable PDF file" + (why.empty() ? std::string() : " (" + why + ")");
    return r;
  }
  if (doc->is_locked()) {
    r.skipped = "an encrypted PDF file (it needs a password)";
    return r;
  }
  for (int p = 0; p < doc->pages(); ++p) {
    const std::unique_ptr<poppler::page> page(doc->create_page(p));
    if (!page) continue;
#if POPPLER_VERSION_MAJOR > 0 || POPPLER_VERSION_MINOR >= 88
    const poppler::byte_array utf8 =
        page->text(poppler::rectf(), poppler::page::non_raw_non_physical_layout).to_utf8();
#else
    const poppler::byte_array utf8 = page->text().to_utf8();
#endif
    const std::string text = tidy_page_text(std::string_view(utf8.data(), utf8.size()));
    if (text.empty()) continue;
    if (!r.text.empty()) r.text += "\n\n";  // pages are paragraphs apart
    r.text += text;
    if (r.text.size() > max_bytes) {
      r.text.clear();
      r.skipped = too_much_text("its text is", max_bytes);
      return r;
    }
  }
  if (!r.text.empty()) r.text += '\n';
  const poppler::byte_array t = doc->get_title().to_utf8();
  r.title = collapse_spaces(std::string_view(t.data(), t.size()));
  r.title_from_text = r.title.empty();
  if (r.title.empty()) r.title = stem;
  return r;
}

}  // namespace
#endif

bool pdf_supported() {
#ifdef CB_HAVE_POPPLER
  return true;
#else
  return false;
#endif
}

// ---------------------------------------------------------------- dispatch

const char* not_text_reason(std::string_view head) {
  if (head.find('\0') != std::string_view::npos)
    return "a binary file (it holds NUL bytes) of a type ingest does not read";
  if (valid_utf8_prefix(head, true) != head.size())
    return "neither UTF-8 text nor of a type ingest reads";
  size_t controls = 0;
  for (char c : head) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') || u == 0x7F) ++controls;
  }
  if (controls * 50 > head.size())
    return "a binary file (control characters) of a type ingest does not read";
  return nullptr;
}

bool looks_like_text(std::string_view head) {
  return not_text_reason(head) == nullptr;
}

namespace {

enum class Kind { kMarkdown, kText, kRst, kHtml, kPdf, kGzip, kOther };

Kind kind_of(const std::string& name) {
  const std::string ext = extension_of(name);
  if (ext == ".md" || ext == ".markdown") return Kind::kMarkdown;
  if (ext == ".txt" || ext == ".text") return Kind::kText;
  if (ext == ".rst") return Kind::kRst;
  if (ext == ".html" || ext == ".htm" || ext == ".xhtml") return Kind::kHtml;
  if (ext == ".pdf") return Kind::kPdf;
  if (ext == ".gz") return Kind::kGzip;
  return Kind::kOther;
}

const char* const kBinary = "a binary file, not text";

ExtractedText extract_uncompressed(const std::string& name, Kind kind, std::string_view bytes,
                                   uint64_t max_bytes) {
  ExtractedText r;
  const std::string stem = stem_of(name);
  // Text files hold no NUL bytes; images, archives and executables do within
  // their first bytes.
  const bool has_nul = bytes.find('\0') != std::string_view::npos;
  switch (kind) {
    case Kind::kMarkdown:
    case Kind::kText:
      if (has_nul) {
        r.skipped = kBinary;
        return r;
      }
      r.text = bytes;
      r.title = first_heading(r.text, stem);
      break;
    case Kind::kOther:
      if (const char* why = not_text_reason(bytes.substr(0, kHeadBytes))) {
        r.skipped = why;
        return r;
      }
      r.text = bytes;
      r.title = first_heading(r.text, name);  // README: its own name, not a stem
      break;
    case Kind::kRst: {
      if (has_nul) {
        r.skipped = kBinary;
        return r;
      }
      std::string t;
      r.text = rst_to_markdown(bytes, &t);
      r.title = t.empty() ? stem : t;
      break;
    }
    case Kind::kHtml: {
      if (has_nul) {
        r.skipped = kBinary;
        return r;
      }
      std::string t;
      r.text = html_to_text(bytes, &t);
      r.title = t.empty() ? stem : t;
      r.title_from_text = t.empty();
      break;
    }
    case Kind::kPdf:
#ifdef CB_HAVE_POPPLER
      r = pdf_text(bytes, max_bytes, stem);
      if (!r.skipped.empty()) return r;
      if (r.text.empty()) {
        r.skipped = "no text in it (a scanned PDF holds only images)";
        return r;
      }
      break;
#else
      r.skipped = "built without PDF support";
      return r;
#endif
    case Kind::kGzip:
      r.skipped = "gzip data inside gzip data is not read";
      return r;
  }
  if (trim(r.text).empty()) {
    r = ExtractedText{};
    r.skipped = "empty";
  } else if (r.text.size() > max_bytes) {
    r = ExtractedText{};
    r.skipped = too_much_text("its text is", max_bytes);
  }
  return r;
}

}  // namespace

bool has_supported_extension(const std::string& file_name) {
  return kind_of(base_name(file_name)) != Kind::kOther;
}

const char* supported_types() {
  return "Markdown (.md, .markdown), text (.txt, .text, and files of other names that hold "
         "text), reStructuredText (.rst), HTML (.html, .htm), "
#ifdef CB_HAVE_POPPLER
         "PDF (.pdf), "
#else
         "PDF (.pdf, but not this build), "
#endif
         "and any of these gzip-compressed (.gz)";
}

ExtractedText extract_text(const std::string& file_name, std::string_view bytes,
                           uint64_t max_bytes) {
  const std::string name = base_name(file_name);
  const Kind kind = kind_of(name);
  if (kind != Kind::kGzip) return extract_uncompressed(name, kind, bytes, max_bytes);
  // "notes.md.gz" holds Markdown; "changelog.Debian.gz" and "README.gz"
  // hold whatever their content looks like.
  std::string error;
  const std::optional<std::string> inner = gunzip(bytes, max_bytes, &error);
  if (!inner) {
    ExtractedText r;
    r.skipped = error;
    return r;
  }
  const std::string inner_name = stem_of(name);
  return extract_uncompressed(inner_name, kind_of(inner_name), *inner, max_bytes);
}

}  // namespace rag
