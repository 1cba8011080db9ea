#include "number_arg.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "json_writer.h"

namespace cbs {

bool parse_number_arg(const std::string& s, double lo, double hi, double& out, std::string& error) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    error = "'" + s + "' is not a number";
    return false;
  }
  if (v < lo || v > hi) {
    error = s + " is outside " + json_number(lo) + ".." + json_number(hi);
    return false;
  }
  out = v;
  return true;
}

}  // namespace cbs
