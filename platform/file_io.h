// POSIX file primitives for code that must be crash safe and must say why an
// operation failed.  Every failure throws cb::Error(kIo) whose message names
// the operation, the path and the OS reason ("pwrite /x/y.tmp: No space left
// on device"), so a caller several layers up can report it unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cb {

// An owned file descriptor.  Positional reads and writes (pread/pwrite) keep no
// shared file offset, so one File may serve several threads at once.
class File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  static File open_read(const std::string& path);
  // Creates a new file, failing if it already exists (O_EXCL), so two writers
  // can never share a temporary name by accident.
  static File create_new(const std::string& path);
  // Opens or creates a file for reading and writing without truncating it.
  static File open_rw(const std::string& path);

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Reads up to n bytes at offset; returns how many were read (fewer only at
  // end of file).  Retries EINTR and short reads.
  size_t pread_some(void* dst, size_t n, uint64_t offset) const;
  // Writes all n bytes at offset or throws (ENOSPC, EFBIG, EIO...).
  void pwrite_all(const void* src, size_t n, uint64_t offset) const;
  void sync() const;  // fsync
  uint64_t size() const;
  void close();

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// An advisory whole-file lock (flock) on a lock file, shared or exclusive,
// released by the destructor or when the process dies, so a killed holder
// never leaves the lock behind.  Locks taken through different File objects
// exclude each other even within one process.
class FileLock {
 public:
  enum class Mode { kShared, kExclusive };
  // Waits up to timeout_ms (0: try once).  Throws kIo on an OS error; use
  // try_acquire to distinguish "busy" from "failed".
  static FileLock acquire(const std::string& path, Mode mode, int timeout_ms);
  // Returns a lock that is not held (held() == false) when still busy after
  // timeout_ms.
  static FileLock try_acquire(const std::string& path, Mode mode, int timeout_ms);
  bool held() const { return file_.is_open(); }

 private:
  File file_;
};

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// The path itself is a symbolic link (not followed).
bool is_symlink(const std::string& path);
// Size in bytes, or -1 if the path does not exist.  Throws on other errors.
int64_t file_size_or_missing(const std::string& path);
// mkdir -p; throws if a component exists but is not a directory.
void make_dirs(const std::string& path);
// Atomic replace within one file system.
void rename_file(const std::string& from, const std::string& to);
// fsync of a directory, which makes a rename or unlink in it durable.
void sync_dir(const std::string& path);
// unlink; returns false if the file did not exist.
bool remove_file(const std::string& path);
// Names (not paths) of the entries in a directory, without "." and "..".
std::vector<std::string> list_dir(const std::string& path);
// Throws kIo naming the directory unless files can be created in it.
void check_writable_dir(const std::string& path);

}  // namespace cb
