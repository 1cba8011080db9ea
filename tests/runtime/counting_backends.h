// Test backends that run every op on the CPU backend while watching, or
// bending, what the runtime asks of a backend: batches, staged uploads.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/forwarding_backend.h"
#include "platform/error.h"

namespace cb::test {

// Runs every op on a CPU backend.  Counts the staging calls (Backend's
// defaults: memcpy uploads), the activation arguments of ops that are not
// alloc_buffer() memory, which a GPU backend would have to stage through
// host copies, and the weight arguments (matrices, norm weights, biases)
// that did not come from prepare_weight(), which a GPU backend would have
// to look up and mirror at every op; before_op() runs before each op.
// With `relocate_weights`, prepare_weight() returns a copy of the CPU's
// result at another address, as a GPU's would be: an op then given the
// model's own pointer counts as unprepared, although the CPU prepares
// most weights in place.
class CountingBackend : public ForwardingBackend {
 public:
  explicit CountingBackend(int n_threads = 2, bool relocate_weights = false)
      : ForwardingBackend(make_cpu_backend(n_threads)), relocate_weights_(relocate_weights) {}
  ~CountingBackend() override {
    for (void* p : relocated_) inner_->free_buffer(p);
  }

  const char* name() const override { return "counting"; }
  void* alloc_buffer(size_t bytes) override {
    void* p = inner_->alloc_buffer(bytes);
    std::lock_guard lock(buffers_mu_);
    buffers_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void free_buffer(void* p) override {
    {
      std::lock_guard lock(buffers_mu_);
      buffers_.erase(static_cast<const char*>(p));
    }
    inner_->free_buffer(p);
  }
  WeightView prepare_weight(const WeightView& host) override {
    WeightView p = inner_->prepare_weight(host);
    const size_t bytes = dtype_row_bytes(p.type, p.n_in) * p.n_out;
    std::lock_guard lock(buffers_mu_);
    if (relocate_weights_) {
      void* copy = inner_->alloc_buffer(bytes);
      std::memcpy(copy, p.data, bytes);
      relocated_.push_back(copy);
      p.data = copy;
    }
    prepared_[static_cast<const char*>(p.data)] = bytes;
    return p;
  }
  void* alloc_host_staging(size_t bytes) override {
    ++staging_allocs;
    return ForwardingBackend::alloc_host_staging(bytes);
  }
  void free_host_staging(void* p) override {
    ++staging_frees;
    ForwardingBackend::free_host_staging(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    ++uploads;
    ForwardingBackend::upload(dst, src, bytes);
  }

  // Loader threads call too.
  std::atomic<int64_t> uploads{0}, staging_allocs{0}, staging_frees{0}, host_args{0},
      unprepared_weights{0};

 protected:
  virtual void before_op(BackendOp) {}
  // Whether p lies in an alloc_buffer() block; that block's start and size.
  bool in_buffer(const void* p, const char** start = nullptr, size_t* bytes = nullptr) {
    std::lock_guard lock(buffers_mu_);
    const char* c = static_cast<const char*>(p);
    auto it = buffers_.upper_bound(c);
    if (it == buffers_.begin() || c >= std::prev(it)->first + std::prev(it)->second) return false;
    if (start) *start = std::prev(it)->first;
    if (bytes) *bytes = std::prev(it)->second;
    return true;
  }
  // alloc_buffer() memory or a prepare_weight() result.
  bool in_backend_memory(const void* p) {
    if (in_buffer(p)) return true;
    std::lock_guard lock(buffers_mu_);
    return inside(prepared_, p);
  }

 private:
  static bool inside(const std::map<const char*, size_t>& blocks, const void* a) {
    const char* p = static_cast<const char*>(a);
    auto it = blocks.upper_bound(p);
    return it != blocks.begin() && p < std::prev(it)->first + std::prev(it)->second;
  }
  void on_op_weights(BackendOp, std::initializer_list<const void*> weights) override {
    std::lock_guard lock(buffers_mu_);
    for (const void* w : weights)
      if (w != nullptr && !inside(prepared_, w)) ++unprepared_weights;
  }
  void on_op_begin(BackendOp op, std::initializer_list<const void*> args) override {
    before_op(op);
    std::lock_guard lock(buffers_mu_);
    for (const void* a : args)
      if (a != nullptr && !inside(buffers_, a)) ++host_args;
  }

  std::mutex buffers_mu_;
  std::map<const char*, size_t> buffers_;   // alloc_buffer() blocks by start
  std::map<const char*, size_t> prepared_;  // prepare_weight() results by start
  const bool relocate_weights_;
  std::vector<void*> relocated_;
};

// Asks for staged uploads and completes them as late as Backend allows, as
// an asynchronous copy engine may: a copy lands only at the issuing
// thread's next wait_uploads() or op.  So a staging slot rewritten, or a
// layer handed over, before its copy is done shows up as wrong numbers.
// Staging memory starts as NaNs, and freeing it under a pending copy fails
// the test.
class StagingBackend final : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  // What wait_uploads() reports per completed copy, in "ms".
  static constexpr double kMsPerCopy = 0.001;

  bool wants_staged_uploads() const override { return true; }
  void* alloc_host_staging(size_t bytes) override {
    if (fail_staging) fail(ErrorCode::kOutOfMemory, "no staging memory left (injected)");
    void* p = CountingBackend::alloc_host_staging(bytes);
    std::memset(p, 0xff, bytes);
    std::lock_guard lock(mu_);
    staging_[p] = bytes;
    return p;
  }
  void free_host_staging(void* p) override {
    {
      std::lock_guard lock(mu_);
      const size_t bytes = staging_.at(p);
      for (const auto& [thread, copies] : pending_)
        for (const Copy& c : copies)
          if (c.src >= static_cast<const char*>(p) && c.src < static_cast<const char*>(p) + bytes)
            ADD_FAILURE() << "staging memory freed under a pending copy";
      staging_.erase(p);
    }
    CountingBackend::free_host_staging(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    ++uploads;
    uploaded_bytes += static_cast<int64_t>(bytes);
    std::lock_guard lock(mu_);
    pending_[std::this_thread::get_id()].push_back(
        {static_cast<char*>(dst), static_cast<const char*>(src), bytes});
  }
  // Reports every copy completed since the previous call, also those an op
  // completed, as a GPU's timing events would.
  double wait_uploads() override {
    complete_copies();
    std::lock_guard lock(mu_);
    return kMsPerCopy *
           static_cast<double>(std::exchange(unreported_[std::this_thread::get_id()], 0));
  }

  size_t pending_copies() {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto& [thread, copies] : pending_) n += copies.size();
    return n;
  }

  bool fail_staging = false;
  std::atomic<int64_t> uploaded_bytes{0};

 private:
  struct Copy {
    char* dst;
    const char* src;
    size_t bytes;
  };
  void before_op(BackendOp) override { complete_copies(); }
  void complete_copies() {
    std::lock_guard lock(mu_);
    auto& mine = pending_[std::this_thread::get_id()];
    for (const Copy& c : mine) std::memcpy(c.dst, c.src, c.bytes);
    unreported_[std::this_thread::get_id()] += mine.size();
    mine.clear();
  }

  std::mutex mu_;
  std::map<std::thread::id, std::vector<Copy>> pending_;
  std::map<std::thread::id, size_t> unreported_;
  std::map<void*, size_t> staging_;
};

// Counts, per op kind, the ops each thread issues outside any batch of its
// own, and its outermost batches: a GPU backend waits for each of those
// ops before it returns, and once for each batch, at its end.
class BatchWatchingBackend final : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  void begin_batch() override {
    {
      std::lock_guard lock(mu_);
      ++depth_[std::this_thread::get_id()];
    }
    CountingBackend::begin_batch();
  }
  void end_batch() override {
    CountingBackend::end_batch();
    std::lock_guard lock(mu_);
    if (--depth_[std::this_thread::get_id()] == 0) ++batches_[std::this_thread::get_id()];
  }
  // The ops `thread` issued outside a batch, by kind.
  std::map<BackendOp, int64_t> unbatched(std::thread::id thread) {
    std::lock_guard lock(mu_);
    return unbatched_[thread];
  }
  // The outermost batches `thread` ended: a GPU backend's waits for them.
  int64_t batches(std::thread::id thread) {
    std::lock_guard lock(mu_);
    return batches_[thread];
  }

 private:
  void before_op(BackendOp op) override {
    std::lock_guard lock(mu_);
    const auto id = std::this_thread::get_id();
    if (depth_[id] == 0) ++unbatched_[id][op];
  }

  std::mutex mu_;
  std::map<std::thread::id, int> depth_;
  std::map<std::thread::id, std::map<BackendOp, int64_t>> unbatched_;
  std::map<std::thread::id, int64_t> batches_;
};

}  // namespace cb::test
