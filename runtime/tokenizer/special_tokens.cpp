#include "runtime/tokenizer/special_tokens.h"

#include <algorithm>
#include <array>

#include "runtime/tokenizer/token_type.h"

namespace cb::tok {

int32_t find_eot_by_text(const std::vector<std::string>& tokens) {
  static constexpr std::array<std::string_view, 9> kEotTexts = {
      "<|im_end|>",    "<|eot_id|>",         "<|end|>",
      "<end_of_turn>", "<|end_of_text|>",    "<EOT>",
      "_<EOT>",        "<end_of_utterance>", "<|endoftext|>",
  };
  for (const std::string_view text : kEotTexts) {
    const auto it = std::find(tokens.begin(), tokens.end(), text);
    if (it != tokens.end()) return static_cast<int32_t>(it - tokens.begin());
  }
  return -1;
}

bool is_end_of_generation_text(std::string_view text) {
  static constexpr std::array<std::string_view, 10> kEogTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",   "<|endoftext|>",
      "<|eom_id|>", "<EOT>",      "_<EOT>",  "<|end_of_text|>", "<end_of_utterance>",
  };
  return std::find(kEogTexts.begin(), kEogTexts.end(), text) != kEogTexts.end();
}

SpecialTokenSplitter::SpecialTokenSplitter(const std::vector<std::string>& tokens,
                                           const std::vector<int32_t>& types) {
  for (size_t i = 0; i < types.size() && i < tokens.size(); ++i) {
    const auto type = static_cast<TokenType>(types[i]);
    const bool user = type == TokenType::kUserDefined;
    if (tokens[i].empty()) continue;
    if (user || type == TokenType::kControl || type == TokenType::kUnknown) {
      specials_.push_back(Special{tokens[i], static_cast<int32_t>(i), user});
    }
  }
  std::sort(specials_.begin(), specials_.end(), [](const Special& a, const Special& b) {
    return a.text.size() != b.text.size() ? a.text.size() > b.text.size() : a.id < b.id;
  });
}

void SpecialTokenSplitter::split(std::string_view text, bool parse_special,
                                 std::vector<Fragment>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back(Fragment{0, static_cast<uint32_t>(text.size()), -1});
  std::vector<Fragment> next;
  for (const Special& special : specials_) {
    if (!parse_special && !special.always) continue;
    bool found = false;
    next.clear();
    for (const Fragment& f : out) {
      if (f.token >= 0 || f.end - f.begin < special.text.size()) {
        next.push_back(f);
        continue;
      }
      uint32_t pos = f.begin;
      while (true) {
        const size_t match = text.substr(0, f.end).find(special.text, pos);
        if (match == std::string_view::npos) break;
        found = true;
        const auto at = static_cast<uint32_t>(match);
        if (at > pos) next.push_back(Fragment{pos, at, -1});
        next.push_back(Fragment{at, static_cast<uint32_t>(at + special.text.size()), special.id});
        pos = at + static_cast<uint32_t>(special.text.size());
      }
      if (pos < f.end) next.push_back(Fragment{pos, f.end, -1});
    }
    if (found) out.swap(next);
  }
}

}  // namespace cb::tok
