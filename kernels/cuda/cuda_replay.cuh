// Part of the CUDA backend (cuda_backend.cu, through cuda_thread_state.cuh):
// replayed batches (Backend::begin_replay) as CUDA graphs.
//
// The first batch under a key runs as usual while each op checks that it
// could be captured: no host input, no temporary device memory, no wait
// for the stream inside the batch.  If all could, the key's next batch is
// captured on the calling thread's stream (the ops are recorded, not run),
// instantiated and launched; every later batch under the key launches that
// graph: one launch instead of one per kernel, and none of the per-op host
// work (argument look-ups, mirrors).  A captured op's host output lands in
// device and page-locked memory of the recording and is copied to its host
// address after the batch's wait.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace cb {
namespace {

// A host output of a recorded batch: copied from `pinned` after each wait.
struct HostCopy {
  void* host;
  const void* pinned;
  size_t bytes;
};

// What the backend keeps per key.  Destroyed only between batches (the
// caller forgets a key before it changes what the ops name), so no launch
// of `exec` is in flight; cudaFree waits for the device anyway.
struct Recording {
  enum class State {
    kProbed,      // its first batch ran, and every op could be captured
    kReplayable,  // captured: `exec` replays it
    kIssued,      // an op could not be captured: batches under the key run as usual
  };
  State state = State::kProbed;
  cudaGraphExec_t exec = nullptr;
  // The bytes of each host output of the probed batch, in op order: the
  // captured batch's outputs get memory of these sizes before the capture
  // starts (nothing is allocated while capturing).
  std::vector<size_t> output_bytes;
  std::vector<void*> device;  // the captured ops' outputs bound for the host
  std::vector<void*> pinned;  // where they land for the host copies
  std::vector<HostCopy> host_copies;

  Recording() = default;
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  ~Recording() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (void* p : device) cudaFree(p);
    for (void* p : pinned) cudaFreeHost(p);
    cudaGetLastError();
  }
};

// How the calling thread's current outermost batch is handled.
enum class ReplayMode {
  kOff,      // an ordinary batch, or a key that is not replayed
  kProbe,    // a key's first batch: runs, and checks that it could be captured
  kCapture,  // a key's second batch: captured into a graph, run at end_batch()
};

}  // namespace
}  // namespace cb
