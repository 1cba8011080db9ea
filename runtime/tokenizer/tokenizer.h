// Text <-> token ids from a GGUF file's tokenizer metadata.  Two families:
//   * "gpt2": byte-level BPE with a regex-style pre-tokenizer chosen by
//     tokenizer.ggml.pre (SmolLM2, Llama 3, ...);
//   * "llama": SentencePiece-style BPE over scores, with byte fallback
//     (Llama 2, Mistral, TinyLlama).
// Special (control / user-defined) tokens are matched in the text only when
// the caller asks for it (parse_special), as llama.cpp does.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/token_type.h"

namespace cb {

// Everything the tokenizer needs, as read from GGUF metadata (runtime/ fills
// it from the file; tests may fill it by hand).
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                   // tokenizer.ggml.pre, may be empty
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores, may be empty
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type, may be empty
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("a b"), may be empty
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;  // end of turn (e.g. <|im_end|>), -1 if none
  int32_t eom_id = -1;  // end of message (Llama 3.1's <|eom_id|>), -1 if none
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;                  // tokenizer.ggml.add_bos_token
  bool add_eos = false;                  // tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix
};

class Tokenizer {
 public:
  // Throws cb::Error (kUnsupported for an unknown model/pre type, kFormat for
  // inconsistent metadata such as a merge naming a missing token).
  explicit Tokenizer(TokenizerVocab vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // add_special: prepend BOS / append EOS as the vocab says.
  // parse_special: text such as "<|im_start|>" becomes its control token.
  // Never fails on any byte sequence (invalid UTF-8 is encoded byte-wise).
  // A byte for which a byte-level vocabulary has no token at all becomes its
  // unknown token if it has a genuine one, else it is dropped (llama.cpp
  // drops it too); SmolLM2 lacks 21 such bytes (0x04, 0xC0, 0xFF, ...), so
  // decode(encode(s)) == s holds for every s without them.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // Concatenated pieces.  Control tokens render as their text when
  // render_special is true and as nothing otherwise.  Ids out of range throw
  // cb::Error(kInvalidArgument).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;
  // The bytes one token stands for (may be a partial UTF-8 sequence).
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // End of generation: EOS, EOT or any other end-of-turn control token.
  bool is_end_of_generation(int32_t id) const;
  std::optional<int32_t> find_token(std::string_view text) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace cb
