// Which model file a sample loads: one rule for every program.
#pragma once

#include <string>

namespace cbs {

// `flag` (--model PATH or a model catalogue name, see model_catalog.h) if
// given, else $CB_MODEL if set, else `recorded` (the model a program's own
// state names, such as the assistant store's) when that file exists, else
// the default model.  A catalogue name
// (and the default model) is looked for in $CB_MODELS_DIR when set, then
// ./models/, then the source tree's models/ (where the set-up script fetches
// it), so a built program works from any directory.  A --model that names
// an existing file is that file, whatever the catalogue holds.
// Throws std::runtime_error naming what is missing.
std::string resolve_model_path(const std::string& flag, const std::string& recorded = "");

}  // namespace cbs
