#include "model_path.h"

#include <sys/stat.h>

#include <cstdlib>
#include <stdexcept>

namespace cbs {
namespace {

// The default model (README.md, "The model": chosen by its answers and time
// to first token on 2 cores); scripts/setup.sh model qwen1.5b fetches it.
constexpr const char* kModelRelative = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

bool regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string resolve_model_path(const std::string& flag) {
  if (!flag.empty()) {
    if (!regular_file(flag)) throw std::runtime_error("model file not found: " + flag);
    return flag;
  }
  if (const char* env = std::getenv("CB_MODEL"); env != nullptr && env[0] != '\0') {
    if (!regular_file(env))
      throw std::runtime_error(std::string("model file not found: ") + env + " (CB_MODEL)");
    return env;
  }
  if (regular_file(kModelRelative)) return kModelRelative;
  const std::string in_sources = std::string(CB_SOURCE_DIR) + "/" + kModelRelative;
  if (regular_file(in_sources)) return in_sources;
  throw std::runtime_error(std::string("no model: CB_MODEL is not set and neither ./") +
                           kModelRelative + " nor " + in_sources +
                           " exists (pass --model PATH, set CB_MODEL, or run "
                           "scripts/setup.sh model qwen1.5b)");
}

}  // namespace cbs
