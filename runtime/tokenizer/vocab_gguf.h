// Reads a TokenizerVocab from a GGUF file's tokenizer.ggml.* metadata.
#pragma once

#include "runtime/gguf/gguf_file.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {

// Fills the defaults llama.cpp applies when a key is absent (add_bos for
// SentencePiece and Llama 3 vocabularies, add_space_prefix for
// SentencePiece) and finds the end-of-turn token by its text when the file
// names none.  Throws cb::Error: kFormat for missing or inconsistent
// metadata (no token list, arrays of different lengths, an id out of range,
// a value of the wrong type), kUnsupported for a tokenizer model other than
// "gpt2" or "llama".
TokenizerVocab read_tokenizer_vocab(const GgufFile& file);

}  // namespace cb
