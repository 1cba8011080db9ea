// The recompute ratio as the samples take it on the command line: "auto"
// (the loading controller picks r) or a number in [0, 1].
#pragma once

#include <string>

namespace cbs {

struct RatioArg {
  bool is_auto = false;
  float value = 0.0f;  // when not auto
};

// Parses `s` into `out`.  On a bad value returns false and sets `error` to
// a message that names the value (for the program's usage error).
bool parse_ratio_arg(const std::string& s, RatioArg& out, std::string& error);

}  // namespace cbs
