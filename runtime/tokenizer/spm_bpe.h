// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): the text, spaces
// already written as U+2581, starts as one symbol per character; the
// adjacent pair whose concatenation is the token with the highest score is
// merged until no pair forms a token.  Characters left without a token are
// spelled with byte tokens <0xXX> (or the unknown token).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/token_index.h"

namespace cb::tok {

class SentencePieceBpe {
 public:
  // Throws cb::Error(kFormat) when some byte has neither a byte token nor an
  // unknown token to fall back to (such text could not be encoded).
  SentencePieceBpe(const TokenIndex& index, int32_t unk_id);

  // `scores` has one entry per token.
  void encode(std::string_view text, const TokenIndex& index, const std::vector<float>& scores,
              std::vector<int32_t>& out) const;

  // " " -> U+2581, with one more in front when `prefix_space`.
  static std::string escape_spaces(std::string_view text, bool prefix_space);

 private:
  std::array<int32_t, 256> byte_fallback_{};  // byte token, else the unknown token
  int32_t unk_id_;
};

}  // namespace cb::tok
