#include "platform/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "platform/error.h"

namespace cb {
namespace {

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 100, 10000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t task, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[task].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

// Thread indices identify a thread for the duration of a call: no two tasks
// that run at the same time share one (kernels index scratch by it).
TEST(ThreadPool, ThreadIndexIsExclusive) {
  ThreadPool pool(3);
  std::vector<std::atomic<bool>> busy(3);
  std::atomic<int> clashes{0};
  for (int rep = 0; rep < 50; ++rep) {
    pool.parallel_for(300, [&](int64_t, int thread) {
      if (busy[thread].exchange(true)) clashes.fetch_add(1);
      volatile double sink = 0;
      for (int i = 0; i < 200; ++i) sink = sink + std::sqrt(static_cast<double>(i));
      busy[thread].store(false);
    });
  }
  EXPECT_EQ(clashes.load(), 0);
}

// Per-task results do not depend on how many threads computed them.
TEST(ThreadPool, ResultsIndependentOfThreadCount) {
  auto compute = [](int threads) {
    ThreadPool pool(threads);
    std::vector<double> out(1000);
    pool.parallel_for(1000, [&](int64_t t, int) {
      double s = 0;
      for (int64_t i = 0; i <= t; ++i) s += 1.0 / static_cast<double>(i + 1);
      out[t] = s;
    });
    return out;
  };
  const std::vector<double> one = compute(1);
  EXPECT_EQ(compute(2), one);
  EXPECT_EQ(compute(3), one);
}

TEST(ThreadPool, PropagatesExceptionsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(1000,
                                 [](int64_t task, int) {
                                   if (task == 5) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t task, int) { sum.fetch_add(task); });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t, int outer_thread) {
    pool.parallel_for(5, [&](int64_t, int thread) {
      EXPECT_EQ(thread, 0);  // inline: the nested call owns no other threads
      inner.fetch_add(1);
    });
    (void)outer_thread;
  });
  EXPECT_EQ(inner.load(), 20);
}

// Decode issues many tiny calls back to back; every one must complete.
TEST(ThreadPool, ManySmallCalls) {
  ThreadPool pool(3);
  int64_t total = 0;
  std::vector<int64_t> slots(3);
  for (int rep = 0; rep < 20000; ++rep) {
    pool.parallel_for(3, [&](int64_t task, int) { slots[task] = task + rep; });
    total += slots[0] + slots[1] + slots[2];
  }
  int64_t want = 0;
  for (int rep = 0; rep < 20000; ++rep) want += 3 * rep + 3;
  EXPECT_EQ(total, want);
}

// Workers that went to sleep wake up for the next call.
TEST(ThreadPool, WakesAfterIdle) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> n{0};
    pool.parallel_for(64, [&](int64_t, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 64);
  }
}

TEST(ThreadPool, CallsFromSeveralThreadsAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        pool.parallel_for(10, [&](int64_t task, int) { sum.fetch_add(task); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * 200 * 45);
}

TEST(ThreadPool, DefaultUsesHardwareThreads) {
  ThreadPool pool(0);
  EXPECT_GE(pool.size(), 1);
}

TEST(ThreadPool, TooManyThreadsIsAnError) {
  try {
    ThreadPool pool(ThreadPool::kMaxThreads + 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

// A thread the system refuses (here: no address space left for its stack)
// is an error; the threads already started are stopped, not destroyed while
// joinable (which would end the process).
TEST(ThreadPool, RefusedThreadIsAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve address space: an address-space limit breaks them";
#else
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::ifstream statm("/proc/self/statm");
    size_t vm_pages = 0;
    statm >> vm_pages;
    const rlim_t limit = vm_pages * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (48u << 20);
    const rlimit rl{limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    // Where the limit is not enforced (qemu-user keeps it from the host),
    // there is nothing to test.
    void* big = mmap(nullptr, size_t{256} << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (big != MAP_FAILED) _exit(77);
    try {
      ThreadPool pool(ThreadPool::kMaxThreads);
      _exit(1);  // every thread started: the limit did not bite
    } catch (const Error& e) {
      _exit(e.code() == ErrorCode::kOutOfMemory ? 0 : 2);
    } catch (...) {
      _exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "RLIMIT_AS is not enforced here";
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

}  // namespace
}  // namespace cb
