// The token types of GGUF tokenizer metadata, apart from the tokenizer so
// that its parts (special_tokens.h) can use them without including it.
#pragma once

#include <cstdint>

namespace cb {

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

}  // namespace cb
