#include "chunker.h"

#include <cstddef>

#include "text_chars.h"

namespace rag {
namespace {

using text::is_space;
using text::trim;

// The level of a Markdown ATX heading line ("# Title": 1, "## Section":
// 2, up to 6); 0 for any other line.
int heading_level(std::string_view line) {
  line = trim(line);
  size_t k = 0;
  while (k < line.size() && line[k] == '#') ++k;
  return k > 0 && k <= 6 && k < line.size() && line[k] == ' ' ? static_cast<int>(k) : 0;
}

// A piece that is one heading line and nothing else.
bool is_heading(std::string_view s) {
  return heading_level(s) > 0 && trim(s).find('\n') == std::string_view::npos;
}

// The headings in effect at a point of a Markdown text, outermost first:
// each heading closes those of its level and deeper.  Lines inside fenced
// code blocks (``` or ~~~) are not headings.
class HeadingPath {
 public:
  // The path above a piece: all of it, or, when the piece begins with a
  // heading of level k, the headings above level k.  One line each.
  std::string above(std::string_view piece) const {
    const std::string_view t = trim(piece);
    const int own = fence_.empty() ? heading_level(t.substr(0, t.find('\n'))) : 0;
    std::string out;
    for (const auto& [level, line] : open_) {
      if (own > 0 && level >= own) break;
      if (!out.empty()) out += '\n';
      out += line;
    }
    return out;
  }
  // Takes in the headings of a piece that follows.
  void read(std::string_view piece) {
    size_t start = 0;
    while (start < piece.size()) {
      size_t end = piece.find('\n', start);
      if (end == std::string_view::npos) end = piece.size();
      const std::string_view line = trim(piece.substr(start, end - start));
      start = end + 1;
      if (line.starts_with("```") || line.starts_with("~~~")) {
        const std::string_view marker = line.substr(0, 3);
        if (fence_.empty()) {
          fence_ = marker;
        } else if (fence_ == marker) {
          fence_.clear();
        }
        continue;
      }
      const int level = fence_.empty() ? heading_level(line) : 0;
      if (level == 0) continue;
      while (!open_.empty() && open_.back().first >= level) open_.pop_back();
      open_.emplace_back(level, std::string(line));
    }
  }

 private:
  std::vector<std::pair<int, std::string>> open_;
  std::string fence_;  // the open code fence's marker, if any
};

// How finely a piece is cut, coarsest first.
enum class Level { kParagraph, kSentence, kLine, kWord, kToken };

Level finer(Level l) {
  return static_cast<Level>(static_cast<int>(l) + 1);
}

// The end of the separator that starts at s[i] for this level, or i when no
// separator starts there.  Separators stay attached to the piece before them,
// so the pieces always concatenate back to the text.
size_t separator_end(std::string_view s, size_t i, Level level) {
  const auto skip_spaces = [&](size_t k) {
    while (k < s.size() && is_space(s[k])) ++k;
    return k;
  };
  switch (level) {
    case Level::kParagraph: {
      // A newline, optional blanks, another newline: a blank line.
      if (s[i] != '\n') return i;
      size_t k = i + 1;
      while (k < s.size() && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) ++k;
      return k < s.size() && s[k] == '\n' ? skip_spaces(k) : i;
    }
    case Level::kSentence: {
      // ". ", "! ", "? " (and the same before a newline) end a sentence.
      if ((s[i] != '.' && s[i] != '!' && s[i] != '?') || i + 1 >= s.size() || !is_space(s[i + 1]))
        return i;
      return skip_spaces(i + 1);
    }
    case Level::kLine:
      return s[i] == '\n' ? skip_spaces(i + 1) : i;
    case Level::kWord:
      return is_space(s[i]) ? skip_spaces(i) : i;
    case Level::kToken:
      break;
  }
  return i;
}

std::vector<std::string_view> split_at(std::string_view s, Level level) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t end = separator_end(s, i, level);
    if (end == i) continue;
    out.push_back(s.substr(start, end - start));
    start = end;
    i = end - 1;
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

struct Piece {
  std::string text;
  size_t n_tokens;
  std::string headings;  // HeadingPath::above(text) where the piece begins
};

// Appends `s` to `out` as pieces of at most `target` tokens each.
void pieces_of(std::string_view s, Level level, size_t target, const TokenCounter& tokens,
               std::vector<Piece>& out) {
  const size_t n = tokens.count(s);
  if (n <= target) {
    out.push_back({std::string(s), n, {}});
    return;
  }
  if (level == Level::kToken) {
    for (std::string& part : tokens.split(s, target)) {
      const size_t k = tokens.count(part);
      out.push_back({std::move(part), k, {}});
    }
    return;
  }
  const std::vector<std::string_view> parts = split_at(s, level);
  if (parts.size() <= 1) {
    pieces_of(s, finer(level), target, tokens, out);
    return;
  }
  for (std::string_view p : parts) pieces_of(p, finer(level), target, tokens, out);
}

}  // namespace

std::vector<Chunk> chunk_text(std::string_view text, size_t target_tokens,
                              const TokenCounter& tokens) {
  if (target_tokens == 0) target_tokens = 1;
  // Paragraphs first: each is cut further only when it alone is too long.
  std::vector<Piece> pieces;
  for (std::string_view para : split_at(text, Level::kParagraph))
    pieces_of(para, Level::kSentence, target_tokens, tokens, pieces);
  HeadingPath path;
  for (Piece& p : pieces) {
    p.headings = path.above(p.text);
    path.read(p.text);
  }

  // Greedy packing.  Counting piece by piece is an upper bound in practice
  // (byte-level BPE pre-splits at spaces, so joining pieces rarely merges
  // tokens across the seam) and avoids recounting a growing chunk.
  std::vector<Chunk> chunks;
  std::vector<const Piece*> cur;
  size_t cur_tokens = 0;
  auto emit = [&](size_t n) {
    std::string text;
    for (size_t i = 0; i < n; ++i) text += cur[i]->text;
    const std::string_view t = trim(text);
    if (!t.empty()) {
      // A chunk carries the headings it sits under, so that its text says
      // what it is about even when the heading lines are chunks away.
      const std::string& above = cur[0]->headings;
      const std::string full = above.empty() ? std::string(t) : above + "\n\n" + std::string(t);
      chunks.push_back({full, tokens.count(full)});
    }
    cur.erase(cur.begin(), cur.begin() + static_cast<std::ptrdiff_t>(n));
    cur_tokens = 0;
    for (const Piece* p : cur) cur_tokens += p->n_tokens;
  };
  for (const Piece& p : pieces) {
    if (!cur.empty() && cur_tokens + p.n_tokens > target_tokens) {
      // A Markdown heading belongs to the text after it: trailing headings
      // move on with it (a chunk of headings alone would be useless, so they
      // may make that chunk overshoot the target by their few tokens).
      size_t keep = cur.size();
      while (keep > 0 && is_heading(cur[keep - 1]->text)) --keep;
      if (keep > 0) emit(keep);
    }
    cur.push_back(&p);
    cur_tokens += p.n_tokens;
  }
  emit(cur.size());
  return chunks;
}

}  // namespace rag
