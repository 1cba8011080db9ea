// Pre-tokenizers of byte-level BPE models: split text into the words that BPE
// then encodes independently.  Each tokenizer.ggml.pre value maps to a
// sequence of split steps, as in llama.cpp (src/llama-vocab.cpp): every step
// refines the pieces of the previous one and never looks across their
// boundaries, so a regex lookahead such as \s+(?!\S) sees the end of a piece
// as the end of the text.  The regexes are implemented by hand (their
// backtracking behaviour is simple enough) so that invalid UTF-8 bytes pass
// through untouched and no regex engine is needed on device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cb::tok {

enum class SplitStep : uint8_t {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // kLlama3 with \p{N} for \p{N}{1,3}: every number character on its own
  kQwen2,
  // \p{N}: every number character on its own.
  kEachNumber,
  // \p{N}+
  kNumberRuns,
  // [\p{P}\$\+<=>\^~\|]+
  kPunctuationRuns,
  // [0-9][0-9][0-9]
  kDigitTriples,
};

struct PreTokenizerSpec {
  std::vector<SplitStep> steps;
  bool ignore_merges = false;    // a word that is itself a token skips BPE (Llama 3)
  bool add_bos_default = false;  // llama.cpp's add_bos when the file does not say
};

// The spec for a tokenizer.ggml.pre value.  An empty name means llama.cpp's
// "default" (with a warning, as the file predates the key); an unknown name
// throws cb::Error(kUnsupported): guessing would silently produce token ids
// the model was not trained on.
PreTokenizerSpec pre_tokenizer_spec(const std::string& pre);

// Splits `text` into words, appended to `words` as byte ranges [begin, end).
// Scratch state lives in the caller so that encoding allocates little.
class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<SplitStep> steps) : steps_(std::move(steps)) {}
  void split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& words) const;

  // The first position at or after `from` where `text` may be cut, each
  // side split alone giving the words of the whole: just after a line break
  // that follows a printable ASCII character other than space and precedes
  // an ASCII letter.  No step's piece spans that point, and no piece before
  // it looks past the line break.  text.size() when there is none.  Long
  // text is split in windows so cut, so that split's tables (~20 bytes per
  // byte of text) stay small.
  static size_t next_cut(std::string_view text, size_t from);

 private:
  std::vector<SplitStep> steps_;
};

}  // namespace cb::tok
