#include "runtime/tokenizer/token_index.h"

#include "platform/error.h"

namespace cb::tok {

TokenIndex::TokenIndex(const std::vector<std::string>& tokens) {
  map_.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].empty()) continue;
    const auto [it, inserted] = map_.emplace(tokens[i], static_cast<int32_t>(i));
    if (!inserted) {
      fail(ErrorCode::kFormat, "tokenizer: tokens " + std::to_string(it->second) + " and " +
                                   std::to_string(i) + " have the same text");
    }
  }
}

}  // namespace cb::tok
