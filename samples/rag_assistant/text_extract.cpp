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

#include "text_chars.h"

#ifdef CB_HAVE_POPPLER
#include <poppler/cpp/poppler-document.h>
#include <poppler/cpp/poppler-global.h>
#include <poppler/cpp/poppler-page.h>
#include <poppler/cpp/poppler-version.h>
#endif

namespace rag {
namespace {

using namespace text;

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

}  // namespace

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
