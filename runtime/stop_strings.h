// Stop strings for streamed generation: a generation stops where its text
// first contains one of them, and the caller never sees a stop string or a
// part of one.  Text that could still become the start of a stop string is
// held back until the next token decides.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cb {

class StopStrings {
 public:
  // Throws cb::Error(kInvalidArgument) for an empty string.  No strings:
  // nothing is ever held back.
  explicit StopStrings(std::vector<std::string> strings);

  struct Cut {
    size_t visible = 0;    // bytes of the text that can be shown now
    bool stopped = false;  // a stop string starts at `visible`
  };
  // `text`: the generated text not yet shown.  When it contains a stop
  // string, shows what precedes the earliest one; else everything before
  // the longest tail that a stop string begins with.
  Cut cut(std::string_view text) const;

  bool empty() const { return strings_.empty(); }

 private:
  std::vector<std::string> strings_;
};

}  // namespace cb
