#include "long_option.h"

namespace cbs {

bool split_inline_value(std::string& arg, std::string& value) {
  if (arg.rfind("--", 0) != 0) return false;
  const size_t eq = arg.find('=');
  if (eq == std::string::npos) return false;
  value = arg.substr(eq + 1);
  arg = arg.substr(0, eq);
  return true;
}

}  // namespace cbs
