// Text from files (file names, GGUF metadata) made safe to print on a
// terminal: the samples' lines stay one line each and no escape sequence
// reaches the terminal.
#pragma once

#include <string>
#include <string_view>

namespace cbs {

// `text` with control characters (C0, DEL and C1, newline and tab included)
// and bytes that are not valid UTF-8 written as \xNN; valid UTF-8 is kept.
std::string printable(std::string_view text);

}  // namespace cbs
