// A long option as the samples take it on the command line: "--flag VALUE"
// or "--flag=VALUE".
#pragma once

#include <string>

namespace cbs {

// When `arg` is "--flag=VALUE", cuts it to "--flag", puts VALUE in `value`
// and returns true (the value came with the flag); otherwise leaves both
// as they are and returns false (a value, if the flag takes one, is the
// next argument).
bool split_inline_value(std::string& arg, std::string& value);

}  // namespace cbs
