#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace rag {

Progress::Progress(std::string label, size_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void Progress::update(size_t done, size_t tokens) {
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    // Redrawing on every chunk would flood a slow terminal.
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    const int tenth = total_ ? static_cast<int>(done * 10 / total_) : 10;
    if (tenth == last_tenth_ || done == total_) return;  // the end is finish()'s
    last_tenth_ = tenth;
  }
  last_draw_ = now;
  draw(done, tokens, false);
}

void Progress::finish(size_t done, size_t tokens) {
  draw(done, tokens, true);
}

void Progress::draw(size_t done, size_t tokens, bool final) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double tok_s = s > 0 ? static_cast<double>(tokens) / s : 0.0;
  // ETA from the rate of items so far (chunks are of similar size; files
  // need not be, so their ETA is rougher).
  const double eta =
      done > 0 ? s / static_cast<double>(done) * static_cast<double>(total_ - done) : 0.0;
  char stats[160];
  std::snprintf(stats, sizeof stats, "%zu/%zu %s  %.0f tok/s  %s %.0fs", done, total_,
                unit_.c_str(), tok_s, final ? "took" : "ETA", final ? s : eta);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ ? static_cast<int>(done * kWidth / total_) : kWidth;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %s\033[K%s", label_.c_str(), bar.c_str(), stats,
                 final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s: %s\n", label_.c_str(), stats);
  }
  std::fflush(stderr);
}

}  // namespace rag
