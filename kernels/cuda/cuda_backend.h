// The CUDA backend: every Backend op on an NVIDIA GPU (desktop or Jetson).
// The backend itself is a plugin, libcacheblend-cuda.so, built when CMake
// finds nvcc; the functions below are in the core (cb_kernels) and load it
// at run time on first use, so the core has no link-time dependency on the
// CUDA runtime or cuBLAS.  This header is plain C++ (no CUDA headers).  See
// docs/CUDA.md.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace cb {

// Where alloc_buffer() memory lives.
enum class CudaMemory {
  kAuto,  // kMapped on an integrated GPU (Jetson: cudaDevAttrIntegrated), else kDevice
  // Device memory (cudaMalloc).  The host never touches it: host data
  // enters through upload() and ops' host inputs and leaves through ops'
  // host outputs, as the runtime does.  An allocation beyond the card's
  // free memory fails at once (kOutOfMemory).  wants_staged_uploads() is
  // true.
  kDevice,
  // Mapped page-locked host memory, used by the GPU in place (zero-copy).
  // The host may write it while kernels run on other buffers, which
  // managed memory on Jetson forbids; wants_staged_uploads() is false.  On
  // a discrete GPU every kernel access crosses PCIe: for tests.
  kMapped,
  // Managed (unified) memory, which the host may also read and write
  // between batches: for tests and tools that fill buffers from the host.
  // Pages migrate on first touch and after the host writes them (an
  // upload() into a managed buffer moves its range to the GPU first);
  // wants_staged_uploads() is true.
  kManaged,
};

struct CudaBackendOptions {
  // matmul with at most this many activation rows (decode, a few sequences)
  // runs the GEMV kernel that reads the quantized blocks directly; more rows
  // (prefill) dequantize the weight to f32 and run cuBLAS SGEMM.  Clamped to
  // [0, 8]; tests set 0 or 8 to force one path.
  int gemv_max_rows = 8;
  // The environment variable CB_CUDA_MEMORY ("device", "mapped" or
  // "managed"), when set, overrides kAuto.
  CudaMemory memory = CudaMemory::kAuto;
  // Device memory for f32 copies of quantized weights, made the first time
  // a weight runs the SGEMM path and kept, so prefill stops paying a
  // dequantization per weight per call (bitwise the same products).  -1:
  // on a discrete GPU half of the device memory free when the backend is
  // made, at most a quarter of the device's; none on an integrated one
  // (Jetson: the memory is the system's); the environment
  // variable CB_CUDA_F32_WEIGHTS_MB, when set, overrides it.  0: none.
  // Whatever the budget, a copy is made only while it takes at most half of
  // the device memory free at that moment.
  int64_t f32_weight_bytes = -1;
  // Replayed batches (Backend::begin_replay: a session's decode tokens) as
  // CUDA graphs: a key's first batch runs as usual and checks that its ops
  // can be captured, its second is captured and launched as one graph, the
  // later ones launch that graph.  The environment variable
  // CB_CUDA_GRAPHS, when set, overrides it ("0" off, anything else on).
  // Ignored while CB_CUDA_PROFILE times every op.  On by default: on an
  // H200, decode at Qwen2.5-Coder-1.5B's shapes ran at 339.6 tok/s
  // replayed against 299.5 issued op by op, the logits the same bit for bit.
  bool replay_batches = true;
};

// Whether the CUDA plugin loads (it is looked for once per process: the file
// named by $CB_CUDA_PLUGIN when set, else libcacheblend-cuda.so.N beside
// the code that calls this, in ../lib from there, then through the system
// search).  When it does not, *why (if given) says what was tried and why
// each failed.  Says nothing about whether a GPU is present.
bool cuda_plugin_available(std::string* why = nullptr);

// Number of CUDA devices this process can use; 0 when the plugin does not
// load, there is no driver or device, or the runtime reports an error (never
// throws), so callers and tests can decide to skip.
int cuda_device_count();

// A backend on CUDA device `device`.  Throws cb::Error(kUnsupported) when
// the plugin does not load (the message says why), the device does not
// exist or the runtime cannot be initialised.
//
// Memory: alloc_buffer() returns device memory on a discrete GPU and mapped
// host memory on an integrated one (CudaBackendOptions::memory);
// prepare_weight() copies a weight to device memory once, in its quantized
// layout (freed with the backend).
// Each calling thread has its own CUDA stream; batches (begin_batch) defer
// completion per thread.  Input pointers in ordinary host memory (index
// arrays in std::vector, say) are accepted and copied; host
// outputs are copied back before the op returns.  See docs/CUDA.md.
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& opts = {});

// GPU timestamps for tools (cuda_bench): cuda_mark() records a CUDA event on
// the calling thread's stream of a backend from make_cuda_backend() (else
// kInvalidArgument); it completes when the work the thread queued before it
// has run.  cuda_elapsed_ms() waits for both marks and returns the time
// between them; marks of different threads (streams) may be compared.
struct CudaEvent;
using CudaMark = std::shared_ptr<CudaEvent>;
CudaMark cuda_mark(Backend& be);
double cuda_elapsed_ms(const CudaMark& from, const CudaMark& to);

// Bytes of f32 weight copies a backend from make_cuda_backend() keeps so far
// (CudaBackendOptions::f32_weight_bytes; else kInvalidArgument): for tests
// and tools.
int64_t cuda_kept_f32_bytes(Backend& be);

// Batches a backend from make_cuda_backend() has launched as one CUDA graph
// so far (CudaBackendOptions::replay_batches; 0 without it): for tests and
// tools.  kInvalidArgument for any other backend.
int64_t cuda_graph_launches(Backend& be);

// Attention calls a backend from make_cuda_backend() has run with the tiled
// kernel so far (CB_CUDA_ATTN=tiles; 0 without it): for tests and tools.
// kInvalidArgument for any other backend.
int64_t cuda_attention_tiles_launches(Backend& be);

}  // namespace cb
