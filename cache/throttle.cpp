#include "cache/throttle.h"

#include <algorithm>
#include <thread>

namespace cb::cache {

void Throttle::set_rate(uint64_t bytes_per_sec) {
  std::lock_guard<std::mutex> lock(mu_);
  rate_ = bytes_per_sec;
  next_free_ = Clock::time_point{};  // a new rate starts with an idle device
}

uint64_t Throttle::rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rate_;
}

void Throttle::acquire(uint64_t n) {
  Clock::time_point done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rate_ == 0 || n == 0) return;
    const auto cost = std::chrono::nanoseconds(
        static_cast<int64_t>(static_cast<double>(n) * 1e9 / static_cast<double>(rate_)));
    // An idle device does not bank time: a read starts no earlier than now.
    const Clock::time_point start = std::max(Clock::now(), next_free_);
    done = start + cost;
    next_free_ = done;
  }
  std::this_thread::sleep_until(done);
}

}  // namespace cb::cache
