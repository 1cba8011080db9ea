// A cancellation check that blocking I/O deep in a call can ask: a request
// installs the check of the work it does (a session's abort callback, a
// loader's stop flag) for the current thread, and a wait on a slow device
// or server polls it, so cancelling the work also ends that wait.
#pragma once

#include <functional>

namespace cb {

class ScopedCancelCheck {
 public:
  // Installs `check` (empty: none) for this thread until destruction, which
  // restores the enclosing one.
  explicit ScopedCancelCheck(std::function<bool()> check);
  ~ScopedCancelCheck();
  ScopedCancelCheck(const ScopedCancelCheck&) = delete;
  ScopedCancelCheck& operator=(const ScopedCancelCheck&) = delete;

 private:
  std::function<bool()> check_;
  const std::function<bool()>* enclosing_;
};

// True when the check installed on this thread says stop (false without
// one; a check that throws counts as stop).
bool cancel_requested();

}  // namespace cb
