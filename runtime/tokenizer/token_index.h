// Text -> id lookup over a vocabulary's token strings.  The keys view the
// strings of the vocabulary that owns them, so the index must not outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cb::tok {

class TokenIndex {
 public:
  TokenIndex() = default;
  // Empty token texts are not indexed (they can never be matched).  Throws
  // cb::Error(kFormat) if two tokens have the same text: which id the text
  // stands for would be ambiguous.
  explicit TokenIndex(const std::vector<std::string>& tokens);

  // -1 when `text` is not a token.
  int32_t find(std::string_view text) const {
    const auto it = map_.find(text);
    return it == map_.end() ? -1 : it->second;
  }

 private:
  std::unordered_map<std::string_view, int32_t> map_;
};

}  // namespace cb::tok
