#include "runtime/tokenizer/spm_bpe.h"

#include <algorithm>
#include <cstdio>

#include "platform/error.h"
#include "platform/utf8.h"
#include "runtime/tokenizer/unicode.h"

namespace cb::tok {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

struct Symbol {
  uint32_t start;
  uint32_t len;  // 0 once absorbed into the left neighbour
  int32_t prev;
  int32_t next;
};

struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t len;  // bytes of the pair when queued; a mismatch means stale
};

// Heap order: highest score first, then leftmost.
bool lower_priority(const Candidate& a, const Candidate& b) {
  return a.score < b.score || (a.score == b.score && a.left > b.left);
}

}  // namespace

std::string SentencePieceBpe::escape_spaces(std::string_view text, bool prefix_space) {
  std::string out;
  out.reserve(text.size() + text.size() / 2 + 3);
  if (prefix_space) out += kSpaceMark;
  for (const char c : text) {
    if (c == ' ') {
      out += kSpaceMark;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

SentencePieceBpe::SentencePieceBpe(const TokenIndex& index, int32_t unk_id) : unk_id_(unk_id) {
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = index.find(hex);
    if (id < 0) id = index.find(std::string(1, static_cast<char>(b)));
    if (id < 0) id = unk_id;
    if (id < 0) {
      fail(ErrorCode::kFormat, std::string("tokenizer: no byte token ") + hex +
                                   " and no unknown token to fall back to");
    }
    byte_fallback_[b] = id;
  }
}

void SentencePieceBpe::encode(std::string_view text, const TokenIndex& index,
                              const std::vector<float>& scores, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = utf8_char(text, i);
    const size_t len = c.valid ? c.len : 1;
    const auto idx = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{static_cast<uint32_t>(i), static_cast<uint32_t>(len), idx - 1, -1});
    if (idx > 0) symbols[idx - 1].next = idx;
    i += len;
  }

  std::vector<Candidate> heap;
  heap.reserve(symbols.size());
  const auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t len = symbols[left].len + symbols[right].len;
    const int32_t id = index.find(text.substr(symbols[left].start, len));
    if (id < 0) return;
    heap.push_back(Candidate{scores[id], left, right, len});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) try_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    // Symbols only grow, so an unchanged total length means both sides are
    // still the ones that were queued.
    if (left.len == 0 || right.len == 0 || left.len + right.len != c.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    try_pair(left.prev, c.left);
    try_pair(c.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].len);
    const int32_t id = index.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte tokens spell the character; without them one unknown token
    // stands for the whole character, as in SentencePiece.
    bool unk_emitted = false;
    for (const char c : piece) {
      const int32_t id = byte_fallback_[static_cast<uint8_t>(c)];
      if (id == unk_id_) {
        if (unk_emitted) continue;
        unk_emitted = true;
      }
      out.push_back(id);
    }
  }
}

}  // namespace cb::tok
