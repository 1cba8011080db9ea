// A progress report on stderr for long work: a bar redrawn in place when
// stderr is a terminal, plain lines (at every tenth of the work) when it is
// a file or a pipe, so that logs stay readable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
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

// How far a request's prefill has come (the session's progress callback):
// at a terminal, once it has taken a second, one line on stderr, redrawn in
// place at most ten times a second and erased when the prefill ends, so the
// answer starts on a clean line; elsewhere nothing (the report says how
// long the prefill took).
class PrefillProgress {
 public:
  PrefillProgress();
  // A request's prefill starts.
  void start();
  // `stage` is a cb_progress_stage; done/total as the callback gives them.
  void update(int stage, int32_t done, int32_t total);
  // Erases the line, if one was drawn.
  void clear();

 private:
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.1 GB", "98.4 MB", "512 B": sizes for people (powers of 1000, as disks
// and download pages count).
std::string human_bytes(double n);

// Bytes, percent, rate and ETA of a download on stderr: redrawn in place at
// most four times a second at a terminal; elsewhere (a log) only a final
// line.
class ByteProgress {
 public:
  ByteProgress(std::string label, uint64_t already);
  void set_start(uint64_t already) { already_ = already; }
  // `have`: bytes of the file so far; `total`: its size, or -1.
  void update(uint64_t have, int64_t total);
  // Ends the display: the last state on its own line.
  void finish(bool complete);

 private:
  std::string line(bool complete) const;
  std::string label_;
  uint64_t already_;
  uint64_t have_ = 0;
  int64_t total_ = -1;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace rag
