// Paragraph-aware chunking of a document to a target number of tokens.
//
// A chunk is the unit of retrieval and of KV reuse, so it should be a run of
// whole paragraphs: the text is split at blank lines first, and only a
// paragraph too long for one chunk is split further, at sentence ends, then
// line breaks, then spaces, and as a last resort between tokens (never inside
// one, and never inside a UTF-8 character).  Pieces are then packed greedily
// into chunks of at most the target.
//
// Markdown headings: a heading line stays with the text after it, and each
// chunk begins with the path of headings it sits under ("# Offices" then
// "## Oslo", one per line, a blank line, then the chunk's text), except the
// ones its own text begins with.  Lines in fenced code blocks are not
// headings.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rag {

// The tokenizer, as the chunker needs it (an interface so that tests can
// drive the chunker without a model).
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  virtual size_t count(std::string_view text) const = 0;
  // `text` cut between tokens into consecutive pieces of at most max_tokens
  // tokens each (as few as possible) whose concatenation is `text`.
  virtual std::vector<std::string> split(std::string_view text, size_t max_tokens) const = 0;
};

struct Chunk {
  std::string text;  // whitespace-trimmed
  size_t n_tokens = 0;
};

// Cuts `text` into chunks of about `target_tokens` tokens (at most that many
// as counted piece by piece, plus the heading path and headings kept with
// their text).  Whitespace-only text gives no chunks.
std::vector<Chunk> chunk_text(std::string_view text, size_t target_tokens,
                              const TokenCounter& tokens);

}  // namespace rag
