// libFuzzer target: any bytes as a document rag_assistant ingests, read as
// each kind of file it takes (Markdown, text, reStructuredText, HTML, those
// gzip-compressed, and a name without an extension), then cut into chunks.
// PDF is left out: its reader is poppler's.
//
// Input: a byte choosing the file name and the size limit, a byte choosing
// the chunks' target size, then the file's bytes.  Checks what samples/rag_assistant/text_extract.h
// and chunker.h promise:
//   - extract_text never throws; a file it skips has a reason and no text, a
//     file it uses has a title and at most the limit's bytes of text;
//   - chunk_text loses no text (every non-space byte of the text is in the
//     chunks, which add only heading lines), gives trimmed, non-empty chunks
//     with their token counts, and cuts valid UTF-8 only between characters.
//
//   build-fuzz/bin/fuzz_documents -max_total_time=60
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "chunker.h"
#include "platform/utf8.h"
#include "text_chars.h"
#include "text_extract.h"

namespace {

constexpr std::array<const char*, 8> kNames = {"notes.md",  "notes.txt",    "guide.rst",
                                               "page.html", "page.html.gz", "notes.md.gz",
                                               "README",    "changelog.gz"};

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_documents: %s\n", what);
  std::abort();
}

bool valid_utf8(std::string_view s) {
  return rag::text::valid_utf8_prefix(s, /*cut_ok=*/false) == s.size();
}

// One token per UTF-8 character (or per maximal invalid subpart), so that
// the last-resort split never cuts a character, as the model's tokenizer
// does not.
class CharTokens final : public rag::TokenCounter {
 public:
  size_t count(std::string_view text) const override {
    size_t n = 0;
    for (size_t i = 0; i < text.size(); i += cb::utf8_char(text, i).len) ++n;
    return n;
  }
  std::vector<std::string> split(std::string_view text, size_t max_tokens) const override {
    std::vector<std::string> out;
    size_t start = 0, n = 0;
    for (size_t i = 0; i < text.size(); i += cb::utf8_char(text, i).len) {
      if (n == max_tokens) {
        out.emplace_back(text.substr(start, i - start));
        start = i;
        n = 0;
      }
      ++n;
    }
    if (start < text.size()) out.emplace_back(text.substr(start));
    return out;
  }
};

void check_chunks(const std::string& text, size_t target) {
  const CharTokens tokens;
  const std::vector<rag::Chunk> chunks = rag::chunk_text(text, target, tokens);
  std::array<size_t, 256> in{}, out{};
  for (const char c : text) ++in[static_cast<uint8_t>(c)];
  const bool utf8 = valid_utf8(text);
  for (const rag::Chunk& c : chunks) {
    require(!c.text.empty() && !rag::text::is_space(c.text.front()) &&
                !rag::text::is_space(c.text.back()),
            "a chunk is empty or not trimmed");
    require(c.n_tokens == tokens.count(c.text), "a chunk's token count is wrong");
    require(!utf8 || valid_utf8(c.text), "a chunk cuts a UTF-8 character");
    for (const char ch : c.text) ++out[static_cast<uint8_t>(ch)];
  }
  for (int b = 0; b < 256; ++b)
    require(rag::text::is_space(static_cast<char>(b)) || out[b] >= in[b], "the chunks lost text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string name = kNames[data[0] % kNames.size()];
  // Small limits reach the too-large paths (gzip inflation stopped there).
  const uint64_t max_bytes = (data[0] & 0x80) ? 64 : 1 << 20;
  const size_t target = 1 + data[1] % 64;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  rag::ExtractedText r;
  try {
    r = rag::extract_text(name, bytes, max_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_documents: extract_text(%s) threw: %s\n", name.c_str(), e.what());
    std::abort();
  }
  if (!r.skipped.empty()) {
    require(r.text.empty(), "a skipped file has text");
    return 0;
  }
  require(!r.title.empty(), "a file read has no title");
  require(r.text.size() <= max_bytes, "a file read has more text than the limit");
  check_chunks(r.text, target);
  return 0;
}
