#include "runtime/tokenizer/byte_bpe.h"

#include <algorithm>

#include "platform/error.h"
#include "platform/utf8.h"
#include "runtime/tokenizer/unicode.h"

namespace cb::tok {
namespace {

constexpr int32_t kMerged = -2;  // symbol absorbed into its left neighbour

struct Symbol {
  int32_t id;  // token id, -1 if the byte has no token, kMerged once absorbed
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t left;  // symbol index; positions never move, so it orders ties
  int32_t left_id;
  int32_t right_id;
  int32_t result;
};

// Heap order: lowest rank first, then leftmost (as HF tokenizers and
// llama.cpp resolve equal ranks).
bool lower_priority(const Candidate& a, const Candidate& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

}  // namespace

std::string ByteLevelBpe::to_token_text(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(byte_to_unicode(static_cast<uint8_t>(c)), text);
  return text;
}

ByteLevelBpe::ByteLevelBpe(const TokenIndex& index, const std::vector<std::string>& merges,
                           bool ignore_merges, int32_t fallback_id)
    : ignore_merges_(ignore_merges), fallback_id_(fallback_id) {
  for (int b = 0; b < 256; ++b) {
    std::string text;
    append_utf8(byte_to_unicode(static_cast<uint8_t>(b)), text);
    byte_tokens_[b] = index.find(text);
  }
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    // Token texts never contain a raw space (the byte mapping moves it to
    // U+0120), so the first space after the first character separates them.
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) {
      fail(ErrorCode::kFormat, "tokenizer: merge " + std::to_string(rank) + " '" + m +
                                   "' is not two space-separated tokens");
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    const int32_t left_id = index.find(left);
    const int32_t right_id = index.find(right);
    const int32_t result = index.find(std::string(left) + std::string(right));
    if (left_id < 0 || right_id < 0 || result < 0) {
      fail(ErrorCode::kFormat, "tokenizer: merge " + std::to_string(rank) + " '" + m +
                                   "' names a token missing from the vocabulary");
    }
    // A repeated pair keeps its first (best) rank.
    merges_.emplace(pair_key(left_id, right_id), Merge{static_cast<int32_t>(rank), result});
  }
}

void ByteLevelBpe::encode_word(std::string_view word, const TokenIndex& index,
                               std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const int32_t whole = index.find(to_token_text(word));
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  const auto n = static_cast<int32_t>(word.size());
  if (n == 1) {
    const int32_t id = byte_tokens_[static_cast<uint8_t>(word[0])];
    if (id >= 0 || fallback_id_ >= 0) out.push_back(id >= 0 ? id : fallback_id_);
    return;
  }

  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = Symbol{byte_tokens_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::vector<Candidate> heap;
  heap.reserve(static_cast<size_t>(n));
  const auto try_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push_back(
        Candidate{it->second.rank, left, symbols[left].id, symbols[right].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    // Stale when either side changed since the pair was queued: ids identify
    // the bytes a symbol covers, and a symbol only ever grows.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = kMerged;
    try_pair(left.prev);
    try_pair(c.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const int32_t id = symbols[i].id;
    if (id >= 0) {
      out.push_back(id);
    } else if (fallback_id_ >= 0) {
      out.push_back(fallback_id_);
    }
  }
}

}  // namespace cb::tok
