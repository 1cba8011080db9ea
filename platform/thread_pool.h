// A persistent pool of worker threads for data-parallel kernels.
//
// Threads are created once; each parallel_for hands the workers a job by
// bumping one atomic word, so a call costs a few hundred nanoseconds while the
// workers are spinning (decode issues ~200 small ops per token).  Idle
// workers spin briefly, then sleep on the atomic (futex) so an idle runtime
// burns no CPU.  The calling thread takes tasks too, so a pool of N threads
// has N - 1 workers.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace cb {

class ThreadPool {
 public:
  // More threads than this is a caller's mistake, not a configuration.
  static constexpr int kMaxThreads = 512;

  // n_threads counts the calling thread; <= 0 means one per hardware thread.
  // Throws Error (kInvalidArgument) above kMaxThreads, and (kOutOfMemory)
  // when the system refuses a thread; the threads started are stopped first.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(task, thread) once for every task in [0, n_tasks), spread over
  // the pool; returns when all calls have returned.  `thread` is in
  // [0, size()) and no two tasks of this call that run at the same time
  // share it, so it can index per-thread scratch owned by the caller.
  // Tasks are handed out dynamically in index order.
  // If a call throws, the remaining tasks are skipped and the first
  // exception is rethrown here.  Calls from several threads are serialized;
  // a call made from inside a task runs its tasks inline on that thread.
  template <class F>
  void parallel_for(int64_t n_tasks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(
        n_tasks,
        [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread);

  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void work(int thread);
  void worker_main(int thread);
  void stop_workers();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one job at a time

  // The current job.  Written by the caller before it publishes job_word_,
  // read by workers after they observe it.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;

  // The job state in one word: generation (high 32 bits), a "closed" bit
  // (bit 31) and the number of workers inside the job (low bits).  A worker
  // joins only an open job of the generation it woke for, so one that wakes
  // late never touches a finished or newer job, and the caller waits only
  // for workers that actually joined, never for one the OS has not yet
  // scheduled.
  std::atomic<uint64_t> state_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace cb
