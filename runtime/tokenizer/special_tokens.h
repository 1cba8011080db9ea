// Special tokens in text: which tokens count as end of turn / generation,
// and how text is cut around control and user-defined tokens before the
// ordinary tokenizer sees it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cb::tok {

// GGUF files often lack tokenizer.ggml.eot_token_id; like llama.cpp, the end
// of turn token is then recognised by its text.  Returns the id of the first
// of the known end-of-turn texts (in a fixed order of preference, ChatML's
// <|im_end|> before the generic <|endoftext|>) present, or -1.
int32_t find_eot_by_text(const std::vector<std::string>& tokens);

// Texts of tokens that end a generation when sampled (llama.cpp's EOG list).
bool is_end_of_generation_text(std::string_view text);

// A piece of the input: raw text [begin, end) or one special token.
struct Fragment {
  uint32_t begin;
  uint32_t end;
  int32_t token;  // -1 for raw text
};

class SpecialTokenSplitter {
 public:
  // `types` holds a cb::TokenType per token.  Control and unknown tokens are
  // matched only when the caller asks for special parsing; user-defined
  // tokens always (they are part of the ordinary vocabulary, as in HF
  // tokenizers and llama.cpp).
  SpecialTokenSplitter(const std::vector<std::string>& tokens, const std::vector<int32_t>& types);

  // llama.cpp's algorithm, so that overlapping candidates resolve the same
  // way: for each special token, longest first, every occurrence in the
  // remaining raw fragments (left to right) is cut out.
  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  struct Special {
    std::string_view text;
    int32_t id;
    bool always;  // user-defined: matched even without parse_special
  };
  std::vector<Special> specials_;
};

}  // namespace cb::tok
