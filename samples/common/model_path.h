// Which model file a sample loads: one rule for every program.
#pragma once

#include <string>

namespace cbs {

// `flag` (--model PATH) if given, else $CB_MODEL if set, else the default
// model under ./models/, else under the source tree's models/ (where the
// set-up script fetches it), so a built program works from any directory.
// Throws std::runtime_error naming what is missing.
std::string resolve_model_path(const std::string& flag);

}  // namespace cbs
