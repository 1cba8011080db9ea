#include "cache/write_back_queue.h"

namespace cb::cache {

WriteBackQueue::WriteBackQueue(size_t depth) : depth_(depth), worker_([this] { run(); }) {}

WriteBackQueue::~WriteBackQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

bool WriteBackQueue::push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.size() >= depth_) return false;
    jobs_.push_back(std::move(job));
    ++pushed_;
  }
  work_cv_.notify_one();
  return true;
}

void WriteBackQueue::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = pushed_;
  idle_cv_.wait(lock, [&] { return done_ >= target; });
}

size_t WriteBackQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(pushed_ - done_);
}

void WriteBackQueue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop requested and everything drained
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
    ++done_;
    idle_cv_.notify_all();
  }
}

}  // namespace cb::cache
