// rag_assistant's text extraction for ingest: HTML, reStructuredText,
// gzip, PDF and the text detector for files of other names.
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "chunker.h"
#include "text_extract.h"
#include "word_tokens.h"

namespace {

using rag_test::WordTokens;

std::string html(std::string_view page, std::string* title = nullptr) {
  std::string t;
  std::string text = rag::html_to_text(page, &t);
  if (title != nullptr) *title = t;
  return text;
}

TEST(HtmlText, DecodesEntities) {
  EXPECT_EQ(html("<p>A &amp; B &lt;c&gt; &quot;d&quot; &apos;e&apos;</p>"),
            "A & B <c> \"d\" 'e'\n");
  EXPECT_EQ(html("&#65;&#x42;&#X43;&#68 &#x1F600; &copy; &eacute;&Eacute; &euro;"),
            "ABCD \xF0\x9F\x98\x80 \xC2\xA9 \xC3\xA9\xC3\x89 \xE2\x82\xAC\n");
  // Unknown, unterminated and impossible references.
  EXPECT_EQ(html("&bogus; &amp &#; &#x; AT&T &#0; &#xD800; &#99999999999;"),
            "&bogus; &amp &#; &#x; AT&T \xEF\xBF\xBD \xEF\xBF\xBD \xEF\xBF\xBD\n");
  // Numeric references in 0x80..0x9F mean Windows-1252's characters.
  EXPECT_EQ(html("&#150;&#147;x&#148;"), "\xE2\x80\x93\xE2\x80\x9Cx\xE2\x80\x9D\n");
  EXPECT_EQ(html("a&nbsp;&nbsp;b"), "a b\n");
}

TEST(HtmlText, DropsScriptsStylesCommentsAndTheHead) {
  std::string title;
  const std::string text = html(
      "<!DOCTYPE html><html><head><meta charset=utf-8><title> The  &amp; Page </title>"
      "<style>p { color: red }</style><script>var hidden = '<p>no</p>';</script>"
      "<link rel=stylesheet href=x.css></head>"
      "<body><!-- a comment with <p>tags</p> --><p>Visible text.</p>"
      "<SCRIPT type=\"text/javascript\">document.write('also hidden')</SCRIPT>"
      "<noscript>Enable scripts.</noscript></body></html>",
      &title);
  EXPECT_EQ(title, "The & Page");
  EXPECT_EQ(text, "Visible text.\n\nEnable scripts.\n");
}

TEST(HtmlText, HeadingsBecomeMarkdownHeadingsTheChunkerFollows) {
  std::string title;
  const std::string text = html(
      "<h1>Guide</h1><p>Intro.</p><h2 id=\"o\">Offices <small>(all)</small></h2>"
      "<h3>Bergen</h3><p>The Bergen office has a harbour view. It opens at nine.</p><h2></h2>",
      &title);
  EXPECT_EQ(title, "Guide");  // no <title>: the first <h1>
  EXPECT_EQ(text,
            "# Guide\n\nIntro.\n\n## Offices (all)\n\n### Bergen\n\n"
            "The Bergen office has a harbour view. It opens at nine.\n");
  const WordTokens tok;
  const auto chunks = rag::chunk_text(text, 8, tok);
  ASSERT_FALSE(chunks.empty());
  // The last chunk is cut from the middle of a section and still says where.
  EXPECT_EQ(chunks.back().text, "# Guide\n## Offices (all)\n### Bergen\n\nIt opens at nine.");
}

TEST(HtmlText, BlockElementsBreakLines) {
  EXPECT_EQ(html("<p>one</p><p>two<br>three</p><div>four</div><div>five</div>"),
            "one\n\ntwo\nthree\n\nfour\nfive\n");
  EXPECT_EQ(html("<ul><li>apples<li>pears</ul>after"), "- apples\n- pears\n\nafter\n");
  EXPECT_EQ(html("<table><tr><th>City<th>Staff<tr><td>Oslo</td><td>12</td></tr></table>"),
            "City | Staff\nOslo | 12\n");
  EXPECT_EQ(html("<p>  spaced\n\n   out\ttext </p>"), "spaced out text\n");
  EXPECT_EQ(html("<pre>\nline 1\n  indented &lt;x&gt;\n</pre><p>after</p>"),
            "line 1\n  indented <x>\n\nafter\n");
  EXPECT_EQ(html("in<b>line</b> <i>tags</i> join"), "inline tags join\n");
}

TEST(HtmlText, LegacyEncodingIsTranscoded) {
  // Not valid UTF-8: read as Windows-1252 (Latin-1's superset).
  EXPECT_EQ(html("<p>caf\xE9 \x93quoted\x94</p>"), "caf\xC3\xA9 \xE2\x80\x9Cquoted\xE2\x80\x9D\n");
}

TEST(HtmlText, MalformedInputNeverFails) {
  struct Case {
    const char* in;
    const char* out;
  };
  const Case cases[] = {
      {"", ""},
      {"<", "<\n"},
      {"<<<>>>", "<<<>>>\n"},
      {"a < b and c > d", "a < b and c > d\n"},
      {"1 <2 and x<y", "1 <2 and x<y\n"},
      {"text <p", "text <p\n"},
      {"before</", "before</\n"},
      {"<script>alert(1)", ""},
      {"<style>p {}", ""},
      {"kept<!-- never closed <p>lost</p>", "kept\n"},
      {"<h1>an unclosed heading", "# an unclosed heading\n"},
      {"<h2>title<p>body text", "## title\n\nbody text\n"},
      {"<a href='x>text</a> more", "text more\n"},
      {"<a href=\"unclosed>quote", "quote\n"},
      {"<p>unclosed <b>bold <i>italic", "unclosed bold italic\n"},
      {"</p></div></li>stray closers", "stray closers\n"},
      {"<title>never closed", ""},
      {"<pre>unclosed pre\n  keeps", "unclosed pre\n  keeps\n"},
      {"<!DOCTYPE", ""},
      {"<?xml version", ""},
      {"&#x110000;&#xFFFFFFFFFFFFFFFF;", "\xEF\xBF\xBD\xEF\xBF\xBD\n"},
      {"<h1>"
       "<h2>"
       "<h3>x</h1>",
       "### x\n"},
  };
  for (const Case& c : cases) EXPECT_EQ(html(c.in), c.out) << c.in;
  // A long unclosed heading is text, not a heading every chunk would carry.
  const std::string long_heading = html("<h1>" + std::string(300, 'w'));
  EXPECT_EQ(long_heading, std::string(300, 'w') + "\n");
  // Random soup of markup characters: never a crash, never a NUL or '\r'.
  std::mt19937 rng(12345);
  const std::string alphabet = "<>/!-&#;x=\"' \nahp1bsript";
  for (int round = 0; round < 3000; ++round) {
    std::string soup;
    const size_t len = rng() % 80;
    for (size_t i = 0; i < len; ++i) soup += alphabet[rng() % alphabet.size()];
    if (round % 3 == 0) soup = "<script>" + soup;
    if (round % 5 == 0) soup += std::string(1, static_cast<char>(rng() % 256));
    std::string title;
    const std::string text = rag::html_to_text(soup, &title);
    EXPECT_EQ(text.find('\0'), std::string::npos) << soup;
    EXPECT_EQ(text.find('\r'), std::string::npos) << soup;
  }
}

// Malformed pages that a naive parser would rescan to the end for every
// '<' (hours for a few megabytes) are read in linear time.
TEST(HtmlText, PathologicalMarkupStaysLinear) {
  const auto start = std::chrono::steady_clock::now();
  std::string quoted_gt;  // '>' only ever inside quotes
  for (int i = 0; i < 100000; ++i) quoted_gt += "<a x='>'";
  std::string no_gt;  // tags that never close
  for (int i = 0; i < 500000; ++i) no_gt += "<a ";
  std::string late_gt = no_gt + ">after";
  std::string unclosed_quotes;
  for (int i = 0; i < 100000; ++i) unclosed_quotes += "<b c=\"d> text ";
  EXPECT_EQ(html(no_gt).size(), no_gt.size());  // all text ('<' that opens no tag)
  EXPECT_EQ(html(late_gt), "after\n");          // one long tag
  html(quoted_gt);
  html(unclosed_quotes);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
}

TEST(TextDetection, ByContent) {
  EXPECT_TRUE(rag::looks_like_text("Plain README text.\r\n\tIndented.\f\n"));
  EXPECT_TRUE(rag::looks_like_text("UTF-8: caf\xC3\xA9, \xE6\x9D\xB1\xE4\xBA\xAC"));
  EXPECT_TRUE(rag::looks_like_text(""));
  // A character cut by the end of the sample is fine; one broken inside is not.
  EXPECT_TRUE(rag::looks_like_text("cut caf\xC3"));
  EXPECT_FALSE(rag::looks_like_text("broken caf\xC3 here"));
  EXPECT_FALSE(rag::looks_like_text("latin-1 caf\xE9 here"));
  EXPECT_FALSE(rag::looks_like_text("overlong \xC0\xAF and surrogate"));
  EXPECT_FALSE(rag::looks_like_text("surrogate \xED\xA0\x80 here"));
  EXPECT_FALSE(rag::looks_like_text(std::string_view("nul\0byte", 8)));
  // A few escape sequences (a colour log) pass; a control-heavy header not.
  std::string log(500, 'a');
  log += "\x1b[31mred\x1b[0m";
  EXPECT_TRUE(rag::looks_like_text(log));
  EXPECT_FALSE(rag::looks_like_text("\x01\x02\x03\x04ELF-ish header with some text in it"));
  EXPECT_EQ(rag::not_text_reason("text"), nullptr);
  EXPECT_NE(std::string(rag::not_text_reason(std::string_view("a\0b", 3))).find("NUL"),
            std::string::npos);
  EXPECT_NE(std::string(rag::not_text_reason("caf\xE9 au lait")).find("UTF-8"), std::string::npos);
  EXPECT_NE(std::string(rag::not_text_reason("\x01\x02\x03\x04\x05")).find("control"),
            std::string::npos);
}

TEST(TextDetection, FilesOfOtherNames) {
  EXPECT_TRUE(rag::has_supported_extension("dir/Notes.MD"));
  EXPECT_TRUE(rag::has_supported_extension("changelog.Debian.gz"));
  EXPECT_TRUE(rag::has_supported_extension("a.pdf"));
  EXPECT_FALSE(rag::has_supported_extension("README"));
  EXPECT_FALSE(rag::has_supported_extension("picture.png"));
  EXPECT_FALSE(rag::has_supported_extension(".hidden"));

  rag::ExtractedText r = rag::extract_text("docs/README", "The tool copies files.\n", 1 << 20);
  EXPECT_EQ(r.skipped, "");
  EXPECT_EQ(r.text, "The tool copies files.\n");
  EXPECT_EQ(r.title, "README");
  r = rag::extract_text("LICENSE", "# The License\n\nText.\n", 1 << 20);
  EXPECT_EQ(r.title, "The License");
  r = rag::extract_text("picture.png", std::string_view("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16),
                        1 << 20);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  EXPECT_TRUE(r.text.empty());
  r = rag::extract_text("blob.md", std::string_view("# x\n\0\1", 6), 1 << 20);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  r = rag::extract_text("blank.txt", " \n\t\n", 1 << 20);
  EXPECT_EQ(r.skipped, "empty");
  r = rag::extract_text("notes.md", "# Notes\n\nBody.\n", 1 << 20);
  EXPECT_EQ(r.title, "Notes");
  EXPECT_TRUE(r.title_from_text);
  r = rag::extract_text("plain.txt", "Body.\n", 1 << 20);
  EXPECT_EQ(r.title, "plain");
}

TEST(RstText, TitlesBecomeHeadings) {
  std::string title;
  const std::string text = rag::rst_to_markdown(
      "=========\n Kestrel \n=========\n\nIntro.\n\nInstalling\n==========\n\nRun it.\n\n"
      "From source\n-----------\nBuild it.\n\nUsage\n=====\n\nAsk.\n",
      &title);
  EXPECT_EQ(title, "Kestrel");
  EXPECT_EQ(text,
            "# Kestrel\n\nIntro.\n\n## Installing\n\nRun it.\n\n### From source\n\nBuild it.\n\n"
            "## Usage\n\nAsk.\n");
  // Through extract_text: the first title is the file's title.
  const rag::ExtractedText r =
      rag::extract_text("guide.rst", "Guide\n~~~~~\n\nText.\n", uint64_t{1} << 20);
  EXPECT_EQ(r.title, "Guide");
  EXPECT_EQ(r.text, "# Guide\n\nText.\n");
}

TEST(RstText, WhatIsNotATitle) {
  std::string title;
  // An underline shorter than the text, a transition between blank lines,
  // an indented line (a block quote or literal block), a line inside a
  // paragraph.
  const std::string in =
      "A long title line\n===\n\ntext\n\n----\n\nmore\n\n    indented\n    --------\n\n"
      "para line one\nline two\n--------\n";
  EXPECT_EQ(rag::rst_to_markdown(in, &title), in);
  EXPECT_EQ(title, "");
  EXPECT_EQ(rag::extract_text("notes.rst", "Just text.\n", 1 << 20).title, "notes");
}

std::string gzip_of(std::string_view data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(Gzip, InflatesMembersAndRefusesBadData) {
  std::string error;
  EXPECT_EQ(rag::gunzip(gzip_of("hello gzip\n"), 1 << 20, &error), "hello gzip\n");
  // Concatenated members (gzip a >> f; gzip b >> f), then zero padding.
  const std::string two = gzip_of("first ") + gzip_of("second") + std::string(8, '\0');
  EXPECT_EQ(rag::gunzip(two, 1 << 20, &error), "first second");
  const std::string whole = gzip_of(std::string(5000, 'q') + "tail");
  EXPECT_FALSE(rag::gunzip(whole.substr(0, whole.size() - 6), 1 << 20, &error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_FALSE(rag::gunzip("plain text", 1 << 20, &error));
  EXPECT_EQ(error, "not gzip data");
  std::string corrupt = gzip_of("some text that deflates into a real stream");
  for (size_t i = 12; i < corrupt.size() - 8; ++i) corrupt[i] = static_cast<char>(0xA5 ^ i);
  EXPECT_FALSE(rag::gunzip(corrupt, 1 << 20, &error));
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(rag::gunzip("", 1 << 20, &error));
}

TEST(Gzip, ABombStopsAtTheBound) {
  // 16 MiB of zeros deflate to ~16 KB; with a 1 MiB bound inflation stops
  // there instead of building the whole text.
  const std::string bomb = gzip_of(std::string(size_t{16} << 20, '\0'));
  ASSERT_LT(bomb.size(), size_t{64} << 10);
  std::string error;
  EXPECT_FALSE(rag::gunzip(bomb, uint64_t{1} << 20, &error));
  EXPECT_NE(error.find("more than the 1.0 MB"), std::string::npos) << error;
  const rag::ExtractedText r = rag::extract_text("bomb.txt.gz", bomb, uint64_t{1} << 20);
  EXPECT_NE(r.skipped.find("--max-file-mb"), std::string::npos) << r.skipped;
  // Exactly at the bound is fine.
  EXPECT_EQ(rag::gunzip(gzip_of(std::string(1000, 'z')), 1000, &error)->size(), 1000u);
  EXPECT_FALSE(rag::gunzip(gzip_of(std::string(1001, 'z')), 1000, &error));
}

TEST(Gzip, TheInnerNameGivesTheType) {
  const uint64_t mb = uint64_t{1} << 20;
  rag::ExtractedText r = rag::extract_text("d/notes.md.gz", gzip_of("# Notes\n\nBody.\n"), mb);
  EXPECT_EQ(r.title, "Notes");
  EXPECT_EQ(r.text, "# Notes\n\nBody.\n");
  r = rag::extract_text("page.HTML.gz", gzip_of("<title>T</title><h2>Part</h2>x &amp; y"), mb);
  EXPECT_EQ(r.title, "T");
  EXPECT_EQ(r.text, "## Part\n\nx & y\n");
  r = rag::extract_text("changelog.Debian.gz", gzip_of("pkg (1.0) unstable\n"), mb);
  EXPECT_EQ(r.skipped, "");
  EXPECT_EQ(r.title, "changelog.Debian");
  r = rag::extract_text("data.tar.gz", gzip_of(std::string("ustar\0\0\0\x01\x02", 10)), mb);
  EXPECT_NE(r.skipped.find("binary"), std::string::npos) << r.skipped;
  r = rag::extract_text("x.txt.gz.gz", gzip_of(gzip_of("x")), mb);
  EXPECT_FALSE(r.skipped.empty());
  r = rag::extract_text("broken.gz", "\x1f\x8b not really", mb);
  EXPECT_FALSE(r.skipped.empty());
}

// A minimal PDF: one page per string (Helvetica text lines), an /Info title,
// and the cross-reference table's byte offsets computed as a writer would.
std::string minimal_pdf(const std::vector<std::string>& pages, const std::string& title) {
  std::vector<std::string> objs = {"<< /Type /Catalog /Pages 2 0 R >>", "",
                                   "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                                   "<< /Title (" + title + ") >>"};
  std::string kids;
  for (size_t i = 0; i < pages.size(); ++i) {
    const size_t page_obj = objs.size() + 1;
    const std::string content = "BT /F1 12 Tf 72 720 Td (" + pages[i] + ") Tj ET";
    objs.push_back(
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << "
        "/F1 3 0 R >> >> /Contents " +
        std::to_string(page_obj + 1) + " 0 R >>");
    objs.push_back("<< /Length " + std::to_string(content.size()) + " >>\nstream\n" + content +
                   "\nendstream");
    kids += std::to_string(page_obj) + " 0 R ";
  }
  objs[1] = "<< /Type /Pages /Kids [" + kids + "] /Count " + std::to_string(pages.size()) + " >>";
  std::string out = "%PDF-1.4\n";
  std::vector<size_t> offsets;
  for (size_t i = 0; i < objs.size(); ++i) {
    offsets.push_back(out.size());
    out += std::to_string(i + 1) + " 0 obj\n" + objs[i] + "\nendobj\n";
  }
  const size_t xref = out.size();
  out += "xref\n0 " + std::to_string(objs.size() + 1) + "\n0000000000 65535 f \n";
  for (size_t off : offsets) {
    char entry[32];
    std::snprintf(entry, sizeof entry, "%010zu 00000 n \n", off);
    out += entry;
  }
  out += "trailer\n<< /Size " + std::to_string(objs.size() + 1) +
         " /Root 1 0 R /Info 4 0 R >>\nstartxref\n" + std::to_string(xref) + "\n%%EOF\n";
  return out;
}

TEST(PdfText, PagesTitleAndBrokenFiles) {
  const std::string pdf =
      minimal_pdf({"The heron nests by the quay.", "Second page here."}, "Harbour Notes");
  const uint64_t mb = uint64_t{1} << 20;
  rag::ExtractedText r = rag::extract_text("notes.pdf", pdf, mb);
  if (!rag::pdf_supported()) {
    EXPECT_EQ(r.skipped, "built without PDF support");
    GTEST_SKIP() << "built without poppler-cpp";
  }
  ASSERT_EQ(r.skipped, "");
  EXPECT_EQ(r.text, "The heron nests by the quay.\n\nSecond page here.\n");
  EXPECT_EQ(r.title, "Harbour Notes");
  EXPECT_FALSE(r.title_from_text);
  r = rag::extract_text("untitled.pdf", minimal_pdf({"Text."}, ""), mb);
  EXPECT_EQ(r.title, "untitled");
  // Gzip-compressed, too.
  r = rag::extract_text("notes.pdf.gz", gzip_of(pdf), mb);
  EXPECT_EQ(r.text, "The heron nests by the quay.\n\nSecond page here.\n");
  // No text (a scanned page would be an image), garbage, a cut-off file.
  r = rag::extract_text("blank.pdf", minimal_pdf({""}, "Blank"), mb);
  EXPECT_NE(r.skipped.find("no text"), std::string::npos) << r.skipped;
  r = rag::extract_text("junk.pdf", "%PDF-1.4\nnothing else", mb);
  EXPECT_NE(r.skipped.find("not a readable PDF"), std::string::npos) << r.skipped;
  r = rag::extract_text("cut.pdf", pdf.substr(0, 40), mb);
  EXPECT_FALSE(r.skipped.empty());
  // Text over the bound is skipped.
  r = rag::extract_text(
      "big.pdf",
      minimal_pdf(std::vector<std::string>(12, "forty characters of text on every page"), ""), 400);
  EXPECT_NE(r.skipped.find("--max-file-mb"), std::string::npos) << r.skipped;
}

}  // namespace
