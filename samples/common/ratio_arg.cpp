#include "ratio_arg.h"

#include <limits>

#include "number_arg.h"

namespace cbs {

bool parse_ratio_arg(const std::string& s, RatioArg& out, std::string& error) {
  if (s == "auto") {
    out = RatioArg{true, 0.0f};
    return true;
  }
  constexpr double kMax = std::numeric_limits<double>::max();
  double v = 0.0;
  if (!parse_number_arg(s, -kMax, kMax, v, error)) {
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
