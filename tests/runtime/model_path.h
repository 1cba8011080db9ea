#pragma once

#include <cstdlib>
#include <string>

namespace cb::test {
// The model under test: CB_MODEL when set, else the default fetched by set-up.
inline std::string model_path() {
  const char* env = std::getenv("CB_MODEL");
  return env && *env ? env : CB_DEFAULT_MODEL;
}
}  // namespace cb::test
