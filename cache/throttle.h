// A read-throughput cap shared by all threads of a store, to emulate slow
// flash (eMMC, SD cards) in tests and benchmarks.  Reads are scheduled on a
// virtual clock: each read of n bytes occupies n / rate seconds after the
// previous one, and its caller sleeps until its slot ends, so B bytes take at
// least B / rate seconds however many threads read.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace cb::cache {

class Throttle {
 public:
  explicit Throttle(uint64_t bytes_per_sec = 0) : rate_(bytes_per_sec) {}
  // 0 removes the cap.
  void set_rate(uint64_t bytes_per_sec);
  uint64_t rate() const;
  // Blocks until n bytes may have been read at the capped rate.
  void acquire(uint64_t n);

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mu_;
  uint64_t rate_;
  Clock::time_point next_free_{};
};

}  // namespace cb::cache
