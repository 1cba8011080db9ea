// The CUDA backend: every Backend op on an NVIDIA GPU (desktop or Jetson).
// This header is plain C++ (no CUDA headers), so the runtime can include it
// whether or not it is compiled with nvcc; the library is cb_kernels_cuda,
// built when CMake is configured with -DCB_CUDA=ON.  See docs/CUDA.md.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace cb {

struct CudaBackendOptions {
  // matmul with at most this many activation rows (decode, a few sequences)
  // runs the GEMV kernel that reads the quantized blocks directly; more rows
  // (prefill) dequantize the weight to f32 and run cuBLAS SGEMM.  Clamped to
  // [0, 8]; tests set 0 or 8 to force one path.
  int gemv_max_rows = 8;
};

// Number of CUDA devices this process can use; 0 when there is no driver,
// no device, or the runtime reports an error (never throws), so callers and
// tests can decide to skip.
int cuda_device_count();

// A backend on CUDA device `device`.  Throws cb::Error(kUnsupported) when
// the device does not exist or the runtime cannot be initialised.
//
// Memory: alloc_buffer() returns CUDA managed (unified) memory, so the host
// code of the runtime can read and write activations and the KV cache
// directly; prepare_weight() copies a weight to device memory once, in its
// quantized layout (freed when the backend is destroyed).  Every op returns
// only after its results are visible to the host.  Input pointers that are
// ordinary host memory (mmapped norm vectors, index arrays in std::vector)
// are accepted and staged to the device; see docs/CUDA.md.
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& opts = {});

}  // namespace cb
