// A read-only memory mapping of a whole file.  Model weights are used in
// place from the mapping, so loading a model costs no copy.
#pragma once

#include <cstddef>
#include <string>

namespace cb {

class MappedFile {
 public:
  // Throws cb::Error(kIo) with the path and the OS reason.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cb
