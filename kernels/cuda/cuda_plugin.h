// The interface between the core and the CUDA backend plugin
// (libcacheblend-cuda.so): one exported function returning a table of the
// backend's entry points.  Both sides are C++ from the same source tree and
// compiler (the table holds C++ types, and cb::Error thrown in the plugin is
// caught in the core), so the loader refuses a plugin whose interface
// version or project version differs from its own.
#pragma once

#include "kernels/cuda/cuda_backend.h"

namespace cb {

// Raised whenever the table, CudaBackendOptions or the Backend interface
// changes shape.
inline constexpr int kCudaPluginInterface = 8;
inline constexpr const char* kCudaPluginEntryPoint = "cb_cuda_plugin_api";

struct CudaPluginApi {
  int interface_version;        // kCudaPluginInterface of the plugin's build
  const char* project_version;  // CB_PROJECT_VERSION of the plugin's build
  int (*device_count)();
  std::unique_ptr<Backend> (*make_backend)(int device, const CudaBackendOptions& opts);
  CudaMark (*mark)(Backend& be);
  double (*elapsed_ms)(const CudaMark& from, const CudaMark& to);
  int64_t (*kept_f32_bytes)(Backend& be);
  int64_t (*graph_launches)(Backend& be);
  int64_t (*attention_tiles_launches)(Backend& be);
};

}  // namespace cb

// Exported by the plugin under kCudaPluginEntryPoint; never null.
extern "C" const cb::CudaPluginApi* cb_cuda_plugin_api();
