// A number as the samples take it on the command line: the whole text a
// finite number in [lo, hi].
#pragma once

#include <string>

namespace cbs {

// Parses `s` into `out`.  On a bad value returns false and sets `error` to
// a message that names the value ("'x' is not a number", "7 is outside
// 0..1") for the program's usage error.
bool parse_number_arg(const std::string& s, double lo, double hi, double& out, std::string& error);

}  // namespace cbs
