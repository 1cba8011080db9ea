// The models known to work with the samples: where each comes from, its exact
// size and SHA-256, and where a program looks for it on disk.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cbs {

struct CatalogModel {
  const char* name;         // short name for --model and `rag_assistant pull`
  const char* file;         // file name in the models directory
  uint64_t size_bytes;      // exact size of the verified file
  const char* sha256;       // lowercase hex of the verified file
  const char* licence;      // the model's licence
  const char* url;          // upstream download address
  const char* description;  // one line: what it is and what it is for
};

// Every known model, smallest first.
const std::vector<CatalogModel>& model_catalog();

// The model the samples load when none is named.
const CatalogModel& default_catalog_model();

// The entry whose short name or file name is `name`; nullptr when none is.
const CatalogModel* find_catalog_model(std::string_view name);

// The entry for a downloaded file name (as the last part of a URL names it);
// nullptr when none matches.
const CatalogModel* find_catalog_file(std::string_view file);

// Where models are stored: `flag` (--models-dir) when not empty, else
// $CB_MODELS_DIR when set and not empty, else "models" (under the current
// directory).
std::string models_dir(const std::string& flag);

}  // namespace cbs
