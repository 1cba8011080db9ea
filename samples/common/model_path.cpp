#include "model_path.h"

#include <sys/stat.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "model_catalog.h"

namespace cbs {
namespace {

bool regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The directories a catalogue model is looked for in, first match wins.
std::vector<std::string> model_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("CB_MODELS_DIR"); env != nullptr && env[0] != '\0')
    dirs.push_back(env);
  dirs.push_back("models");
  dirs.push_back(std::string(CB_SOURCE_DIR) + "/models");
  return dirs;
}

// The first existing DIR/file of model_dirs(), else "" with `tried` listing
// the paths looked at.
std::string find_model_file(const std::string& file, std::string& tried) {
  for (const std::string& dir : model_dirs()) {
    const std::string path = dir + "/" + file;
    if (regular_file(path)) return path;
    tried += (tried.empty() ? "" : ", ") + path;
  }
  return "";
}

}  // namespace

std::string resolve_model_path(const std::string& flag, const std::string& recorded) {
  if (!flag.empty()) {
    if (regular_file(flag)) return flag;
    const CatalogModel* m = find_catalog_model(flag);
    if (m == nullptr) throw std::runtime_error("model file not found: " + flag);
    std::string tried;
    std::string path = find_model_file(m->file, tried);
    if (path.empty())
      throw std::runtime_error("model '" + flag + "' is not downloaded (looked for " + tried +
                               "): rag_assistant pull " + m->name + " fetches it");
    return path;
  }
  if (const char* env = std::getenv("CB_MODEL"); env != nullptr && env[0] != '\0') {
    if (!regular_file(env))
      throw std::runtime_error(std::string("model file not found: ") + env + " (CB_MODEL)");
    return env;
  }
  std::string tried;
  if (!recorded.empty()) {
    if (regular_file(recorded)) return recorded;
    tried = recorded;
  }
  // README.md, "The model": the default is chosen by its answers and time
  // to first token on 2 cores.
  const CatalogModel& m = default_catalog_model();
  std::string path = find_model_file(m.file, tried);
  if (path.empty())
    throw std::runtime_error(std::string("no model: CB_MODEL is not set and none of ") + tried +
                             " exists (pass --model PATH|NAME, set CB_MODEL, or run "
                             "scripts/setup.sh model qwen1.5b or rag_assistant pull " +
                             m.name + ")");
  return path;
}

}  // namespace cbs
