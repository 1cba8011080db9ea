// Byte-level BPE (GPT-2 family): a word's bytes start as single-byte tokens
// and the adjacent pair with the lowest merge rank is merged until no listed
// merge applies.  A heap of candidate pairs over a linked list of symbols
// makes a word of n bytes cost O(n log n), not a rescan per merge.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/token_index.h"

namespace cb::tok {

class ByteLevelBpe {
 public:
  // `merges` are "left right" in rank order, both sides and their
  // concatenation being tokens (in the byte-to-unicode spelling); anything
  // else throws cb::Error(kFormat).  `fallback_id` is emitted for a byte the
  // vocabulary has no token for (-1: the byte is dropped, as llama.cpp does).
  ByteLevelBpe(const TokenIndex& index, const std::vector<std::string>& merges, bool ignore_merges,
               int32_t fallback_id);

  // Appends the tokens of one pre-tokenized word (raw bytes, non-empty).
  void encode_word(std::string_view word, const TokenIndex& index, std::vector<int32_t>& out) const;

  // The byte-to-unicode spelling of raw bytes, as tokens are stored.
  static std::string to_token_text(std::string_view bytes);

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_tokens_{};
  bool ignore_merges_;
  int32_t fallback_id_;
};

}  // namespace cb::tok
