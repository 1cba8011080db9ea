// A parsed, memory-mapped GGUF file (v2 or v3).  Every count, length, offset
// and dimension is checked against the file size before use, so a truncated
// or hostile file yields cb::Error(kFormat), never an out-of-bounds read or a
// huge allocation.  Tensor data stays in the mapping (zero copy).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace cb {

class MappedFile;

// GGUF metadata value types.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> dims;  // ne[0] (fastest varying) first
  uint64_t offset = 0;        // from the start of the data section
  uint64_t n_bytes = 0;
  const void* data = nullptr;  // inside the mapping
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // mmaps and parses `path`.  Throws cb::Error: kIo (cannot open/map),
  // kFormat (malformed), kUnsupported (unknown tensor type, version).
  static GgufFile open(const std::string& path);
  // Parses a buffer the caller keeps alive for the lifetime of the result
  // (used by the fuzzer and tests; no copy).
  static GgufFile parse(const void* data, size_t size);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const;
  const std::string& path() const;  // empty for parse()
  const void* base() const;         // start of the file bytes
  size_t size() const;

  // Metadata.  Getters return nullopt when the key is absent and throw
  // cb::Error(kFormat) when it is present with an incompatible type.
  bool has(std::string_view key) const;
  std::optional<GgufType> type_of(std::string_view key) const;
  std::vector<std::string> keys() const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;   // any integer type
  std::optional<double> get_float(std::string_view key) const;  // f32/f64 (or integer)
  std::optional<bool> get_bool(std::string_view key) const;
  // Array getters: empty vector when absent; kFormat on wrong element type.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const;
  const GgufTensor* find_tensor(std::string_view name) const;  // nullptr if absent

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cb
