// Shared helpers of the tests that run the real model.
#pragma once

#include <cmath>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "runtime/model.h"

namespace cb::test {

// The model under test: CB_MODEL when set, else the default fetched by set-up.
inline std::string model_path() {
  const char* env = std::getenv("CB_MODEL");
  return env && *env ? env : CB_DEFAULT_MODEL;
}

// One loaded model per test binary (loading maps the file; sharing it keeps
// the suite fast).
inline const Model& shared_model() {
  static std::unique_ptr<Model> m = Model::load(model_path());
  return *m;
}

// ||a - b|| / ||b||, in double.
inline double rel_l2(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace cb::test
