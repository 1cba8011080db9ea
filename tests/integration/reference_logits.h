// The float64 reference's output files (tests/oracle/reference_forward.py)
// and the comparison every test against it makes.
#pragma once

#include <cmath>
#include <cstddef>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace cb::test {

// <name>.logits.f64: raw little-endian float64 logits.
inline std::vector<double> read_f64(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<double> v(static_cast<size_t>(in.tellg()) / sizeof(double));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(double)));
  return v;
}

struct LogitsError {
  double rel_l2 = 0.0;  // |ours - ref| / |ref|
  bool same_argmax = false;
};

inline LogitsError compare_logits(std::span<const float> ours, const std::vector<double>& ref) {
  double num = 0, den = 0;
  size_t ref_top = 0, our_top = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (ours[i] - ref[i]) * (ours[i] - ref[i]);
    den += ref[i] * ref[i];
    if (ref[i] > ref[ref_top]) ref_top = i;
    if (ours[i] > ours[our_top]) our_top = i;
  }
  return {std::sqrt(num / den), ref_top == our_top};
}

}  // namespace cb::test
