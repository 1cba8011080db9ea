// The text ingest chunks, from each kind of file it reads.
//
// A file's kind comes from its name: Markdown (.md, .markdown), plain text
// (.txt, .text), reStructuredText (.rst), HTML (.html, .htm), PDF (.pdf), and
// any of these gzip-compressed (.gz: the name without .gz says what is
// inside).  A file of any other name (README, LICENSE, notes.log) is used as
// plain text when its content looks like text.  Every extractor gives
// Markdown-style headings ("## Section") where the format has headings, so
// that the chunker keeps each chunk's heading path, and none of them ever
// fails on malformed input: what cannot be read is a skip reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rag {

struct ExtractedText {
  std::string text;   // UTF-8 (as far as the file's own bytes are)
  std::string title;  // never empty when `skipped` is
  // True when the title is the text's own first "# " heading or the file
  // name, so that a hash of the text (and the path) covers it too.
  bool title_from_text = true;
  std::string skipped;  // non-empty: why the file is not used (then no text)
};

// The text of a file called `file_name` (a path or a bare name: only its last
// component counts) whose content is `bytes`.  Text larger than `max_bytes`
// after decompression or extraction is skipped, never built in full.
ExtractedText extract_text(const std::string& file_name, std::string_view bytes,
                           uint64_t max_bytes);

// Whether a walked folder's file is worth reading: a supported extension,
// else `head` (its first bytes, kHeadBytes or fewer) looks like text.
constexpr size_t kHeadBytes = 8192;
bool has_supported_extension(const std::string& file_name);
// No NUL byte, valid UTF-8 (a sequence cut by the end of `head` allowed) and
// few control characters (at most 1 in 50 bytes; tab, line breaks and form
// feed are not counted).
bool looks_like_text(std::string_view head);
// Why `head` does not look like text (for a warning); nullptr when it does.
const char* not_text_reason(std::string_view head);

// The types ingest reads, for messages ("Markdown (.md, .markdown), ...").
const char* supported_types();

// The parts, for tests.
// HTML to text: <script>, <style>, comments and <head> (but its <title>)
// dropped, block elements as line or paragraph breaks, <h1>..<h6> as "# " ..
// "###### " lines, entities decoded.  *title: the <title>, else the first
// <h1>, else empty.
std::string html_to_text(std::string_view html, std::string* title);
// reStructuredText with its section titles (a line underlined, and maybe
// overlined, with a repeated punctuation character) as Markdown headings,
// levels in the order the styles first appear.  *title: the first one's text,
// else empty.
std::string rst_to_markdown(std::string_view rst, std::string* title);
// The gzip data (one or more members) inflated; nullopt with *error set when
// it is not gzip, corrupt or truncated, or when it inflates to more than
// max_bytes (inflation stops there).
std::optional<std::string> gunzip(std::string_view data, uint64_t max_bytes, std::string* error);
// Whether this build reads PDF files (poppler-cpp was found).
bool pdf_supported();

}  // namespace rag
