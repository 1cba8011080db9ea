// HTML to text for ingest (text_extract.h: html_to_text).
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "platform/utf8.h"
#include "text_chars.h"
#include "text_extract.h"

namespace rag {
namespace {

using namespace text;

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
      if (cp >= 0x80 && cp < 0xA0 && cp1252_high(static_cast<unsigned char>(cp)) != 0)
        cp = cp1252_high(static_cast<unsigned char>(cp));
      if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
      cb::append_utf8(cp, out);
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
          cb::append_utf8(e.cp, out);
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

// One page's conversion to text: the text so far, the title, and the open
// elements that change how text is written (the head, <pre>, a heading).
class HtmlConverter {
 public:
  explicit HtmlConverter(std::string_view html) : html_(html), tag_ends_(html) {}

  // The page's text; `title` (unless null): <title>, else the first <h1>.
  std::string convert(std::string* title) {
    const size_t n = html_.size();
    while (i_ < n) {
      const size_t lt = html_.find('<', i_);
      if (lt == std::string_view::npos) {
        emit_text(html_.substr(i_));
        break;
      }
      emit_text(html_.substr(i_, lt - i_));
      i_ = lt;
      markup(lt);
    }
    close_heading();
    if (title != nullptr) *title = have_title_ ? page_title_ : first_h1_;
    std::string text(trim(out_.str()));
    if (!text.empty()) text += '\n';
    return text;
  }

 private:
  void close_heading() {
    if (heading_ == 0) return;
    std::string& s = out_.str();
    const std::string text = collapse_spaces(std::string_view(s).substr(heading_start_));
    s.resize(heading_start_);
    if (text.size() > kMaxHeadingBytes) {
      out_.text(text, false);
    } else if (!text.empty()) {
      out_.raw(std::string(static_cast<size_t>(heading_), '#') + " " + text);
      if (heading_ == 1 && first_h1_.empty()) first_h1_ = text;
    }
    heading_ = 0;
    out_.paragraph_break();
  }

  void emit_text(std::string_view raw) {
    if (raw.empty() || in_head_) return;
    out_.text(decode_entities(raw), pre_depth_ > 0 && heading_ == 0);
  }

  // What starts with the '<' at `lt`: a comment, a declaration, a tag, or
  // text ("a < b").  Moves i_ past it.
  void markup(size_t lt) {
    const size_t n = html_.size();
    const char next = lt + 1 < n ? html_[lt + 1] : '\0';
    if (html_.substr(lt, 4) == "<!--") {  // a comment; unclosed, it runs to the end
      const size_t end = html_.find("-->", lt + 4);
      i_ = end == std::string_view::npos ? n : end + 3;
      return;
    }
    if (next == '!' || next == '?') {  // <!DOCTYPE ...>, <![CDATA[...]]>, <?xml ...?>
      const size_t end = html_.find('>', lt + 2);
      i_ = end == std::string_view::npos ? n : end + 1;
      return;
    }
    const bool closing = next == '/';
    const size_t name_start = lt + (closing ? 2 : 1);
    if (name_start >= n || !is_ascii_alpha(html_[name_start])) {
      emit_text("<");  // a '<' that starts no tag is text ("a < b")
      i_ = lt + 1;
      return;
    }
    size_t k = name_start;
    while (k < n && (is_ascii_alnum(html_[k]) || html_[k] == '-' || html_[k] == ':')) ++k;
    const std::string tag = lower(html_.substr(name_start, k - name_start));
    const size_t end = tag_ends_.after(k);
    if (end == std::string_view::npos) {
      emit_text("<");
      i_ = lt + 1;
      return;
    }
    i_ = end;
    if (!closing && (tag == "script" || tag == "style" || tag == "title" || tag == "textarea"))
      raw_text_element(tag);
    else
      element(tag, closing);
  }

  // The content of <script>, <style>, <title> or <textarea>: raw text up
  // to the closing tag (none: to the end).
  void raw_text_element(const std::string& tag) {
    const size_t n = html_.size();
    const size_t close = find_ci(html_, "</" + tag, i_);
    const std::string_view content =
        html_.substr(i_, close == std::string_view::npos ? n - i_ : close - i_);
    i_ = close == std::string_view::npos ? n : tag_ends_.after(close + 2 + tag.size());
    if (i_ == std::string_view::npos) i_ = n;
    if (tag == "title" && !have_title_) {
      page_title_ = collapse_spaces(decode_entities(content));
      have_title_ = !page_title_.empty();
    } else if (tag == "textarea") {
      emit_text(content);
    }
  }

  // Any other tag: the breaks, heading marks and cell separators it makes
  // in the text.
  void element(const std::string& tag, bool closing) {
    if (tag == "head") {
      in_head_ = !closing;
      return;
    }
    const int level = heading_tag_level(tag);
    const Block block = block_kind(tag);
    if (level == 0 && block == Block::kNone && tag != "pre" && tag != "td" && tag != "th") return;
    in_head_ = false;  // body content: the head ended without its closing tag
    if (level > 0) {
      close_heading();
      if (!closing) {
        out_.paragraph_break();
        heading_ = level;
        heading_start_ = out_.str().size();
      }
      return;
    }
    if (heading_ > 0) {
      // Inside a heading a line break is a space; any other block ends it.
      if (tag == "br") {
        out_.space();
        return;
      }
      close_heading();
    }
    if (tag == "pre") {
      out_.paragraph_break();
      if (!closing) {
        ++pre_depth_;
        // The newline right after <pre> is not text.
        if (i_ < html_.size() && html_[i_] == '\n') ++i_;
      } else if (pre_depth_ > 0) {
        --pre_depth_;
      }
      return;
    }
    if (tag == "td" || tag == "th") {
      if (!closing && !out_.at_line_start()) out_.raw(" | ");
      return;
    }
    if (block == Block::kParagraph) {
      out_.paragraph_break();
    } else {
      out_.line_break();
    }
    if (tag == "li" && !closing) out_.raw("- ");
  }

  std::string_view html_;
  TagEnds tag_ends_;
  HtmlText out_;
  size_t i_ = 0;  // where the conversion is in html_
  std::string page_title_, first_h1_;
  bool have_title_ = false, in_head_ = false;
  int pre_depth_ = 0;
  int heading_ = 0;           // the open <hN>'s level, 0: none
  size_t heading_start_ = 0;  // where its text begins in the output
};

}  // namespace

std::string html_to_text(std::string_view html_in, std::string* title) {
  // Pages without a valid UTF-8 encoding are, in practice, Windows-1252.
  std::string transcoded;
  std::string_view html = html_in;
  if (valid_utf8_prefix(html_in, false) != html_in.size()) {
    transcoded = cp1252_to_utf8(html_in);
    html = transcoded;
  }
  return HtmlConverter(html).convert(title);
}

}  // namespace rag
