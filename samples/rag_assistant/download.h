// One resumable HTTP(S) download into a `.part` file (libcurl): what
// `rag_assistant pull` fetches before it checks and installs a model.  Only
// in a build with download support (CB_HAVE_DOWNLOAD).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "app.h"

namespace rag {

// strerror(e).
std::string errno_text(int e);

// The .part file, open for writing at its end and locked against a second
// pull of the same file.
class PartFile {
 public:
  explicit PartFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot write " + path + ": " + errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
      throw Error("another pull is writing " + path + " (wait for it to end)");
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0) throw Error("cannot write " + path + ": " + errno_text(errno));
    size_ = static_cast<uint64_t>(end);
  }
  ~PartFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  void truncate() {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0)
      throw Error("cannot write " + path_ + ": " + errno_text(errno));
    size_ = 0;
  }
  // Flushes to disk and closes; a full disk shows here at the latest.
  void close_synced() {
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot write " + path_ + ": " + errno_text(e));
    }
    if (::close(fd) != 0) throw Error("cannot write " + path_ + ": " + errno_text(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Appends the bytes of `url` to `part` after its first `have` bytes (an
// HTTP Range: a server that sends the whole file instead starts the part
// over, one that cannot resume is asked once more for the whole file),
// with a progress line named `label` on stderr.  Returns the bytes the part
// holds; `total` becomes the size the server gave, if any.  SIGINT and
// SIGTERM stop it between two writes.  Throws Error (an HTTP error, a full
// disk, an interrupt, a short body), saying how much of the part is kept
// for the next attempt.
uint64_t download(const std::string& url, const std::string& label, PartFile& part,
                  const std::string& part_path, uint64_t have, int64_t& total);

}  // namespace rag
