// Part of the CUDA backend (cuda_backend.cu, its only includer): what each
// calling thread owns (stream, mirrors, bounce memory, cuBLAS handle) and
// the hand-over of a finished thread's stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_replay.cuh"

namespace cb {
namespace {

// ----------------------------------------------------- per-thread state --

// Device mirrors of small read-only host inputs (positions, token ids and
// row indices in std::vector), keyed by
// host address and checked against a host copy of the bytes on every use: a
// hit costs a memcmp, a changed content is uploaded again into the same
// mirror.  So kernels see exactly the bytes the host held at the call, as if
// they were staged every time.
struct Mirror {
  std::vector<unsigned char> host;  // the bytes the device copy holds
  void* dev = nullptr;
  size_t cap = 0;
};
constexpr size_t kMirrorMaxBytes = size_t{64} << 10;  // per input
constexpr size_t kMirrorMaxTotal = size_t{64} << 20;  // all mirrors of a thread
constexpr size_t kMirrorMaxEntries = 4096;

// Page-locked bounce memory, bump-allocated.  Every host input is first
// copied here by the CPU, then uploaded by an asynchronous copy, and device
// outputs bound for host memory land here before the CPU copies them out.
// Why: cudaMemcpyAsync from pageable memory may wait for the stream (which
// would turn every mirror refresh inside a batch into a synchronisation),
// and only a CPU copy made before the op returns lets the caller reuse its
// input at once, whatever the driver does.  Blocks are only reused after the
// stream that reads them has been synchronised (reset()).
class PinnedArena {
 public:
  PinnedArena() = default;
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;
  ~PinnedArena() { release(); }

  void* get(size_t bytes) {
    bytes = (bytes + 255) & ~size_t{255};  // keeps every piece 256-byte aligned
    for (; cur_ < blocks_.size(); ++cur_) {
      Block& b = blocks_[cur_];
      if (b.cap - b.used >= bytes) {
        void* p = b.p + b.used;
        b.used += bytes;
        return p;
      }
    }
    Block b;
    b.cap = std::max(kBlockBytes, bytes);
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, b.cap, cudaHostAllocDefault), "cudaHostAlloc (bounce memory)");
    b.p = static_cast<char*>(p);
    b.used = bytes;
    blocks_.push_back(b);
    cur_ = blocks_.size() - 1;
    return b.p;
  }

  // Only once nothing queued reads the blocks any more.  A thread that once
  // staged something large gives that memory back here.
  void reset() {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.cap;
    if (total > kKeepBytes) release();
    for (Block& b : blocks_) b.used = 0;
    cur_ = 0;
  }

  void release() {
    for (const Block& b : blocks_) cudaFreeHost(b.p);
    blocks_.clear();
    cur_ = 0;
  }

 private:
  static constexpr size_t kBlockBytes = size_t{256} << 10;
  static constexpr size_t kKeepBytes = size_t{16} << 20;
  struct Block {
    char* p = nullptr;
    size_t cap = 0;
    size_t used = 0;
  };
  std::vector<Block> blocks_;
  size_t cur_ = 0;
};

// What one calling thread owns: its stream and everything that is only
// correct because it is ordered on that stream (mirrors, GEMM scratch,
// bounce memory, cuBLAS handle).  Only the owning thread touches a context
// (the backend's mutex guards the thread -> context map, not the contents).
struct ThreadCtx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;  // created at the thread's first GEMM
  int depth = 0;                  // begin_batch() nesting
  void* scratch = nullptr;        // dequantized weight slices for SGEMM
  size_t scratch_bytes = 0;
  // Split attention's partial results, the last (largest) one in use.  None
  // is freed before the context: a recorded decode graph may name any.
  std::vector<void*> attn_partials;
  size_t attn_partial_bytes = 0;
  std::unordered_map<const void*, Mirror> mirrors;
  size_t mirror_bytes = 0;
  PinnedArena arena;
  std::vector<void*> deferred;  // cudaFree after the next synchronisation (no memory pools)
  struct Upload {
    cudaEvent_t start, end;
  };
  std::vector<Upload> uploads;     // not yet summed by wait_uploads()
  std::vector<cudaEvent_t> spare;  // recycled timing events
  double upload_ms = 0.0;          // of uploads already folded out of `uploads`
  struct TimedOp {
    const char* op;
    cudaEvent_t start, end;
  };
  std::vector<TimedOp> timed;  // CB_CUDA_PROFILE: ops not yet added to the totals
  // The outermost batch's replay (cuda_replay.cuh): its mode and key; a
  // probe's finding (every op could be captured so far) and its host
  // outputs' sizes; the recording being captured and how many of its
  // outputs the ops took; the host copies to make after the batch's wait.
  ReplayMode replay = ReplayMode::kOff;
  uint64_t replay_key = 0;
  bool capturable = true;
  std::vector<size_t> probed_outputs;
  std::unique_ptr<Recording> capture;
  size_t captured_outputs = 0;
  const std::vector<HostCopy>* host_copies = nullptr;
};

// The thread -> context map, shared with the thread-exit hook below so a
// context can be handed to the next new thread when its thread ends (the
// fusor starts a loader thread per request; without this every request
// would leave a stream behind).  Its mutex is the backend's lock.
struct CtxTable {
  std::mutex mu;
  std::unordered_map<std::thread::id, ThreadCtx*> by_thread;
  std::vector<ThreadCtx*> idle;  // their threads have exited

  void thread_exited(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_thread.find(id);
    if (it == by_thread.end()) return;
    idle.push_back(it->second);
    by_thread.erase(it);
  }
};

// Per thread: the tables (backends) this thread has a context in, told when
// the thread ends.  A backend destroyed earlier has expired its weak_ptr.
class ThreadExitHook {
 public:
  ~ThreadExitHook() {
    const std::thread::id id = std::this_thread::get_id();
    for (const auto& w : tables_) {
      if (auto t = w.lock()) t->thread_exited(id);
    }
  }
  void add(const std::shared_ptr<CtxTable>& t) {
    tables_.erase(std::remove_if(tables_.begin(), tables_.end(),
                                 [](const std::weak_ptr<CtxTable>& w) { return w.expired(); }),
                  tables_.end());
    tables_.push_back(t);
  }

 private:
  std::vector<std::weak_ptr<CtxTable>> tables_;
};
thread_local ThreadExitHook t_exit_hook;

}  // namespace
}  // namespace cb
