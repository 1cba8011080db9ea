#include "platform/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "platform/cpu_features.h"
#include "platform/error.h"

namespace cb {
namespace {

// Set while a thread runs tasks of some pool, so a nested parallel_for runs
// inline instead of deadlocking on the pool it is already inside.
thread_local bool t_in_task = false;

// An idle thread polls (pausing) for kSpin, then keeps polling but yields
// its core until kYield, then sleeps on a futex.  Polling bridges the gap
// between consecutive ops of one token; yielding keeps an oversubscribed
// machine (more runnable threads than cores) moving; sleeping makes an idle
// runtime cost nothing.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kYield = std::chrono::microseconds(300);

constexpr uint64_t kGenShift = 32;
constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kCountMask = kClosed - 1;

uint64_t generation(uint64_t s) {
  return s >> kGenShift;
}
uint64_t participants(uint64_t s) {
  return s & kCountMask;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Waits until done(state) holds, spinning, then yielding, then sleeping.
template <class Done>
uint64_t wait_for(const std::atomic<uint64_t>& state, Done&& done) {
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (int i = 1;; ++i) {
    const uint64_t s = state.load(std::memory_order_acquire);
    if (done(s)) return s;
    if (yielding) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
    // Reading the clock costs more than a pause; check it now and then.
    if (i % 64 == 0) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > kYield) break;
      yielding = waited > kSpin;
    }
  }
  for (;;) {
    const uint64_t s = state.load(std::memory_order_acquire);
    if (done(s)) return s;
    state.wait(s, std::memory_order_acquire);
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  n_threads_ = n_threads > 0 ? n_threads : cpu_hardware_threads();
  if (n_threads_ > kMaxThreads) {
    fail(ErrorCode::kInvalidArgument, "a thread pool of " + std::to_string(n_threads_) +
                                          " threads: at most " + std::to_string(kMaxThreads));
  }
  workers_.reserve(n_threads_ - 1);
  try {
    for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_main(t); });
  } catch (...) {
    // Destroying a joinable std::thread terminates the process: the
    // workers already started must be stopped before the error leaves.
    const size_t started = workers_.size();
    stop_workers();
    try {
      throw;
    } catch (const std::exception& e) {  // std::system_error, std::bad_alloc
      fail(ErrorCode::kOutOfMemory, "cannot start thread " + std::to_string(started + 2) + " of " +
                                        std::to_string(n_threads_) + ": " + e.what());
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::stop_workers() {
  stop_.store(true, std::memory_order_relaxed);
  // A new generation wakes every worker; each sees stop_ and exits.
  state_.fetch_add(uint64_t{1} << kGenShift, std::memory_order_release);
  state_.notify_all();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
}

void ThreadPool::work(int thread) {
  const bool was_in_task = t_in_task;
  t_in_task = true;
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    try {
      fn_(ctx_, task, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      next_task_.store(n_tasks_, std::memory_order_relaxed);  // skip the rest
    }
  }
  t_in_task = was_in_task;
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;  // generation of the last job this worker looked at
  for (;;) {
    uint64_t s = wait_for(state_, [seen](uint64_t v) { return generation(v) != seen; });
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = generation(s);
    // Join the job unless it is already closed (or replaced).
    bool joined = false;
    while (generation(s) == seen && (s & kClosed) == 0) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    work(thread);
    const uint64_t before = state_.fetch_sub(1, std::memory_order_acq_rel);
    if ((before & kClosed) != 0 && participants(before) == 1) state_.notify_all();
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || n_threads_ == 1 || t_in_task) {
    const bool was_in_task = t_in_task;
    t_in_task = true;
    try {
      for (int64_t i = 0; i < n_tasks; ++i) fn(ctx, i, 0);
    } catch (...) {
      t_in_task = was_in_task;
      throw;
    }
    t_in_task = was_in_task;
    return;
  }

  std::lock_guard<std::mutex> lock(call_mutex_);
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  error_ = nullptr;
  next_task_.store(0, std::memory_order_relaxed);
  // Open the next generation with no participants; the release publishes
  // the job fields to every worker that observes it.
  const uint64_t gen = generation(state_.load(std::memory_order_relaxed)) + 1;
  state_.store(gen << kGenShift, std::memory_order_release);
  state_.notify_all();

  work(0);

  // Every task has been claimed.  Close the job so no late worker joins,
  // then wait for the ones inside to finish their last task.
  const uint64_t s = state_.fetch_or(kClosed, std::memory_order_acq_rel);
  if (participants(s) != 0) {
    wait_for(state_, [](uint64_t v) { return participants(v) == 0; });
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace cb
