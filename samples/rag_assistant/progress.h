// A progress report on stderr for long work: a bar redrawn in place when
// stderr is a terminal, plain lines (at every tenth of the work) when it is
// a file or a pipe, so that logs stay readable.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace rag {

class Progress {
 public:
  // `unit`: what the items are ("chunks", "files").
  Progress(std::string label, size_t total, std::string unit = "chunks");
  // `done` items finished, `tokens` tokens processed so far.
  void update(size_t done, size_t tokens);
  // The final state, then a newline (terminal).
  void finish(size_t done, size_t tokens);

 private:
  void draw(size_t done, size_t tokens, bool final);
  std::string label_;
  size_t total_;
  std::string unit_;
  bool tty_;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace rag
