// A stand-in for the tokenizer in rag_assistant's model-free tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chunker.h"

namespace rag_test {

// One "token" per whitespace-separated word; split() cuts between words.
class WordTokens final : public rag::TokenCounter {
 public:
  size_t count(std::string_view text) const override { return words(text).size(); }
  std::vector<std::string> split(std::string_view text, size_t max_tokens) const override {
    // Pieces of max_tokens words, each keeping the spaces before its next
    // word so that the concatenation is the text.
    std::vector<std::string> out;
    std::string cur;
    size_t n = 0, i = 0;
    while (i < text.size()) {
      const bool space = text[i] == ' ' || text[i] == '\n';
      if (!space && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
        if (n == max_tokens) {
          out.push_back(cur);
          cur.clear();
          n = 0;
        }
        ++n;
      }
      cur += text[i++];
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  }

 private:
  static std::vector<std::string> words(std::string_view s) {
    std::vector<std::string> w;
    std::string cur;
    for (char c : s) {
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
        if (!cur.empty()) w.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) w.push_back(cur);
    return w;
  }
};

}  // namespace rag_test
