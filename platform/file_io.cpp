#include "platform/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "platform/error.h"

namespace cb {
namespace {

[[noreturn]] void fail_errno(const char* op, const std::string& path, int err) {
  fail(ErrorCode::kIo, std::string(op) + " " + path + ": " + std::strerror(err));
}

}  // namespace

File File::open_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("open", path, errno);
  return File(fd, path);
}

File File::create_new(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("create", path, errno);
  return File(fd, path);
}

File File::open_rw(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("open", path, errno);
  return File(fd, path);
}

File::~File() {
  close();
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

void File::close() {
  if (fd_ >= 0) {
    ::close(fd_);  // nothing useful to do on failure: data paths call sync() first
    fd_ = -1;
  }
}

size_t File::pread_some(void* dst, size_t n, uint64_t offset) const {
  size_t done = 0;
  auto* out = static_cast<char*>(dst);
  while (done < n) {
    ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("pread", path_, errno);
    }
    if (r == 0) break;  // end of file
    done += static_cast<size_t>(r);
  }
  return done;
}

void File::pwrite_all(const void* src, size_t n, uint64_t offset) const {
  size_t done = 0;
  const auto* in = static_cast<const char*>(src);
  while (done < n) {
    ssize_t w = ::pwrite(fd_, in + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("pwrite", path_, errno);
    }
    done += static_cast<size_t>(w);
  }
}

void File::sync() const {
  if (::fsync(fd_) != 0) fail_errno("fsync", path_, errno);
}

uint64_t File::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) fail_errno("fstat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

FileLock FileLock::try_acquire(const std::string& path, Mode mode, int timeout_ms) {
  FileLock lock;
  File f = File::open_rw(path);
  const int op = (mode == Mode::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // Polling rather than a blocking flock: a blocking call cannot time out, and
  // a store must not hang forever behind a stuck peer.
  for (;;) {
    if (::flock(f.fd(), op) == 0) {
      lock.file_ = std::move(f);
      return lock;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) fail_errno("flock", path, errno);
    if (std::chrono::steady_clock::now() >= deadline) return lock;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

FileLock FileLock::acquire(const std::string& path, Mode mode, int timeout_ms) {
  FileLock lock = try_acquire(path, mode, timeout_ms);
  if (!lock.held()) {
    fail(ErrorCode::kIo, "flock " + path + ": still locked by another user after " +
                             std::to_string(timeout_ms) + " ms");
  }
  return lock;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_symlink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

int64_t file_size_or_missing(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return -1;
    fail_errno("stat", path, errno);
  }
  return static_cast<int64_t>(st.st_size);
}

void make_dirs(const std::string& path) {
  if (path.empty()) fail(ErrorCode::kInvalidArgument, "make_dirs: empty path");
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) == 0) continue;
    const int err = errno;
    if (err == EEXIST) {
      if (!is_directory(prefix))
        fail(ErrorCode::kIo, "mkdir " + prefix + ": exists and is not a directory");
      continue;
    }
    fail_errno("mkdir", prefix, err);
  }
}

void rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail_errno("rename", from + " -> " + to, errno);
}

void sync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("open", path, errno);
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) fail_errno("fsync", path, err);
}

bool remove_file(const std::string& path) {
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  fail_errno("unlink", path, errno);
}

std::vector<std::string> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) fail_errno("opendir", path, errno);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) fail_errno("readdir", path, err);
  return names;
}

void check_writable_dir(const std::string& path) {
  if (!is_directory(path)) fail(ErrorCode::kIo, path + ": not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0) fail_errno("access", path, errno);
}

}  // namespace cb
