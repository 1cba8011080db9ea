#include "ratio_arg.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace cbs {

bool parse_ratio_arg(const std::string& s, RatioArg& out, std::string& error) {
  if (s == "auto") {
    out = RatioArg{true, 0.0f};
    return true;
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    error = "'" + s + "' is not a number or auto";
    return false;
  }
  if (v < 0.0 || v > 1.0) {
    error = s + " is outside [0, 1]";
    return false;
  }
  out = RatioArg{false, static_cast<float>(v)};
  return true;
}

}  // namespace cbs
