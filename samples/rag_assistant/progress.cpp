#include "progress.h"

#include <unistd.h>

#include <cstdio>

#include "cacheblend/cacheblend.h"

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

PrefillProgress::PrefillProgress() : tty_(::isatty(STDERR_FILENO) != 0) {}

void PrefillProgress::start() {
  start_ = std::chrono::steady_clock::now();
}

void PrefillProgress::update(int stage, int32_t done, int32_t total) {
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::seconds(1) ||
      (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)))
    return;
  last_draw_ = now;
  drawn_ = true;
  const double s = std::chrono::duration<double>(now - start_).count();
  const char* what = stage == CB_PROGRESS_CHUNK   ? "computing a document's KV: layer"
                     : stage == CB_PROGRESS_BLEND ? "blending the documents' KV: layer"
                                                  : "reading the prompt: token";
  std::fprintf(stderr, "\rrag_assistant: %s %d of %d (%.0f s)\x1b[K", what, done, total, s);
  std::fflush(stderr);
}

void PrefillProgress::clear() {
  if (!drawn_) return;
  drawn_ = false;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
}

std::string human_bytes(double n) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
  return buf;
}

ByteProgress::ByteProgress(std::string label, uint64_t already)
    : label_(std::move(label)),
      already_(already),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ByteProgress::update(uint64_t have, int64_t total) {
  have_ = have;
  total_ = total;
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(250)) return;
  last_draw_ = now;
  drawn_ = true;
  std::fprintf(stderr, "\r%s\x1b[K", line(false).c_str());
  std::fflush(stderr);
}

void ByteProgress::finish(bool complete) {
  if (tty_ && drawn_) {
    std::fprintf(stderr, "\r%s\x1b[K\n", line(complete).c_str());
  } else if (complete) {
    std::fprintf(stderr, "%s\n", line(true).c_str());
  }
  std::fflush(stderr);
}

std::string ByteProgress::line(bool complete) const {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double fetched = static_cast<double>(have_ >= already_ ? have_ - already_ : 0);
  const double rate = s > 0.0 ? fetched / s : 0.0;
  std::string out = label_ + "  " + human_bytes(static_cast<double>(have_));
  if (total_ > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(have_) / total_);
    out += " / " + human_bytes(static_cast<double>(total_)) + "  " + pct;
  }
  out += "  " + human_bytes(rate) + "/s";
  if (complete) {
    char t[32];
    std::snprintf(t, sizeof t, "  in %.1f s", s);
    out += t;
  } else if (total_ > 0 && rate > 0.0 && static_cast<uint64_t>(total_) > have_) {
    const long eta = static_cast<long>((static_cast<double>(total_) - have_) / rate + 0.5);
    char t[48];
    if (eta >= 3600)
      std::snprintf(t, sizeof t, "  ETA %ldh%02ldm", eta / 3600, eta / 60 % 60);
    else
      std::snprintf(t, sizeof t, "  ETA %ldm%02lds", eta / 60, eta % 60);
    out += t;
  }
  return out;
}

}  // namespace rag
