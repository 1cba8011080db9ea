#include "runtime/stop_strings.h"

#include <algorithm>

#include "platform/error.h"

namespace cb {

StopStrings::StopStrings(std::vector<std::string> strings) : strings_(std::move(strings)) {
  for (const std::string& s : strings_)
    if (s.empty()) fail(ErrorCode::kInvalidArgument, "a stop string is empty");
}

StopStrings::Cut StopStrings::cut(std::string_view text) const {
  size_t first = std::string_view::npos;
  for (const std::string& s : strings_) first = std::min(first, text.find(s));
  if (first != std::string_view::npos) return {first, true};
  // Held: the longest tail of `text` that is a proper prefix of a stop
  // string (a longer tail would contain the whole string, found above).
  size_t held = 0;
  for (const std::string& s : strings_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > held; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        held = len;
        break;
      }
    }
  }
  return {text.size() - held, false};
}

}  // namespace cb
