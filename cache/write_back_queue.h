// A bounded queue of jobs run in order by one worker thread.  The store uses
// it so that writing a freshly computed chunk (encode, compress, fsync) never
// sits on the time-to-first-token path.  When the queue is full, push refuses
// the job instead of blocking: a cache write is always optional, a stalled
// request is not.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace cb::cache {

class WriteBackQueue {
 public:
  // depth: how many jobs may wait (the one running is not counted).
  explicit WriteBackQueue(size_t depth);
  // Runs every queued job, then stops the worker.
  ~WriteBackQueue();
  WriteBackQueue(const WriteBackQueue&) = delete;
  WriteBackQueue& operator=(const WriteBackQueue&) = delete;

  // False (job dropped) when depth jobs are already waiting.  Jobs must not
  // throw; the store wraps them.
  bool push(std::function<void()> job);
  // Returns once every job pushed before the call has finished.
  void flush();
  size_t pending() const;

 private:
  void run();

  const size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // worker waits for jobs or stop
  std::condition_variable idle_cv_;  // flush waits for completion
  std::deque<std::function<void()>> jobs_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started after the state above exists
};

}  // namespace cb::cache
