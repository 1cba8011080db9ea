// The core's side of the CUDA backend: finds and loads the plugin
// (libcacheblend-cuda.so) once per process and forwards the functions of
// cuda_backend.h to it.  Built into every build, with or without nvcc.
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_plugin.h"
#include "platform/error.h"
#include "platform/shared_library.h"

namespace cb {
namespace {

struct Plugin {
  const CudaPluginApi* api = nullptr;
  std::string why;  // when api is null: what was tried
};

std::vector<std::string> plugin_candidates() {
  if (const char* path = std::getenv("CB_CUDA_PLUGIN"); path != nullptr && *path != '\0')
    return {path};
  std::vector<std::string> candidates;
  // Beside the code that loads it: libcacheblend.so's directory, or an
  // executable's when the core is linked statically (build/bin and
  // prefix/bin then find it in ../lib).
  const std::string here = directory_of_code(reinterpret_cast<const void*>(&plugin_candidates));
  if (!here.empty()) {
    candidates.push_back(here + "/" + CB_CUDA_PLUGIN_FILE);
    if (!here.ends_with("/lib")) candidates.push_back(here + "/../lib/" + CB_CUDA_PLUGIN_FILE);
  }
  candidates.push_back(CB_CUDA_PLUGIN_FILE);
  return candidates;
}

Plugin load_plugin() {
  Plugin plugin;
  // One line: callers print it as a single error message.
  std::string tried;
  const auto note = [&tried](const std::string& what) {
    tried += (tried.empty() ? " " : "; ") + what;
  };
  for (const std::string& path : plugin_candidates()) {
    std::string error;
    void* library = open_shared_library(path, &error);
    if (library == nullptr) {
      note(error);
      continue;
    }
    using Entry = const CudaPluginApi* (*)();
    const auto entry =
        reinterpret_cast<Entry>(shared_library_symbol(library, kCudaPluginEntryPoint));
    const CudaPluginApi* api = entry != nullptr ? entry() : nullptr;
    if (api == nullptr) {
      note(path + ": not a cacheblend CUDA plugin (no " + kCudaPluginEntryPoint + ")");
      continue;
    }
    if (api->interface_version != kCudaPluginInterface ||
        std::string(api->project_version) != CB_PROJECT_VERSION) {
      note(path + ": built for cacheblend " + api->project_version + " (interface " +
           std::to_string(api->interface_version) + "), this is " + CB_PROJECT_VERSION +
           " (interface " + std::to_string(kCudaPluginInterface) + ")");
      continue;
    }
    plugin.api = api;
    return plugin;
  }
  plugin.why = std::string("the CUDA backend plugin ") + CB_CUDA_PLUGIN_FILE +
               " could not be loaded (a build without nvcc has none; $CB_CUDA_PLUGIN names "
               "its path); tried:" +
               tried;
  return plugin;
}

const Plugin& plugin() {
  static const Plugin loaded = load_plugin();
  return loaded;
}

// The devices the CUDA driver (libcuda) reports, asked without the plugin:
// 0 when there is no driver, it fails to start, or it sees no device.
int driver_device_count() {
  static const int count = [] {
    std::string error;
    void* driver = open_shared_library("libcuda.so.1", &error);
    if (driver == nullptr) return 0;
    using Init = int (*)(unsigned);
    using Count = int (*)(int*);
    const auto init = reinterpret_cast<Init>(shared_library_symbol(driver, "cuInit"));
    const auto get_count =
        reinterpret_cast<Count>(shared_library_symbol(driver, "cuDeviceGetCount"));
    int n = 0;
    if (init == nullptr || get_count == nullptr || init(0) != 0 || get_count(&n) != 0) return 0;
    return n;
  }();
  return count;
}

const CudaPluginApi& api_or_fail() {
  const Plugin& p = plugin();
  if (p.api == nullptr) fail(ErrorCode::kUnsupported, p.why);
  return *p.api;
}

}  // namespace

bool cuda_plugin_available(std::string* why) {
  const Plugin& p = plugin();
  if (p.api == nullptr && why != nullptr) *why = p.why;
  return p.api != nullptr;
}

int cuda_device_count() {
  // Without a driver or a device the plugin is not loaded: it maps the CUDA
  // runtime and cuBLAS (~190 MiB of resident memory) for nothing.
  if (driver_device_count() == 0) return 0;
  const Plugin& p = plugin();
  return p.api != nullptr ? p.api->device_count() : 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& opts) {
  return api_or_fail().make_backend(device, opts);
}

CudaMark cuda_mark(Backend& be) {
  return api_or_fail().mark(be);
}

double cuda_elapsed_ms(const CudaMark& from, const CudaMark& to) {
  return api_or_fail().elapsed_ms(from, to);
}

int64_t cuda_kept_f32_bytes(Backend& be) {
  return api_or_fail().kept_f32_bytes(be);
}

int64_t cuda_graph_launches(Backend& be) {
  return api_or_fail().graph_launches(be);
}

int64_t cuda_attention_tiles_launches(Backend& be) {
  return api_or_fail().attention_tiles_launches(be);
}

}  // namespace cb
