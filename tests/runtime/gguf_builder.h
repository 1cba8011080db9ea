// Builds small GGUF files in memory for tests: valid ones, and (by editing
// the bytes afterwards) every kind of malformed one.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cb::test {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  void kv_u32(const std::string& key, uint32_t v) { kv(key, 4, &v, sizeof v); }
  void kv_f32(const std::string& key, float v) { kv(key, 6, &v, sizeof v); }
  void kv_str(const std::string& key, const std::string& v) {
    key_(key);
    put<uint32_t>(meta_, 8);
    str(meta_, v);
    ++n_kv_;
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    key_(key);
    put<uint32_t>(meta_, 9);
    put<uint32_t>(meta_, 8);
    put<uint64_t>(meta_, v.size());
    for (const auto& s : v) str(meta_, s);
    ++n_kv_;
  }
  // A tensor with `data` bytes (must match its type and dims).
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims,
              const std::vector<uint8_t>& data) {
    str(info_, name);
    put<uint32_t>(info_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(info_, d);
    put<uint32_t>(info_, type);
    while (blob_.size() % 32) blob_.push_back(0);
    put<uint64_t>(info_, blob_.size());
    blob_.insert(blob_.end(), data.begin(), data.end());
    ++n_tensors_;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, 0x46554747);
    put<uint32_t>(out, version_);
    put<uint64_t>(out, n_tensors_);
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    out.insert(out.end(), info_.begin(), info_.end());
    while (out.size() % 32) out.push_back(0);
    out.insert(out.end(), blob_.begin(), blob_.end());
    return out;
  }

 private:
  template <typename T>
  static void put(std::vector<uint8_t>& b, T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  static void str(std::vector<uint8_t>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void key_(const std::string& k) { str(meta_, k); }
  void kv(const std::string& key, uint32_t type, const void* v, size_t n) {
    key_(key);
    put<uint32_t>(meta_, type);
    const uint8_t* p = static_cast<const uint8_t*>(v);
    meta_.insert(meta_.end(), p, p + n);
    ++n_kv_;
  }

  uint32_t version_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
  std::vector<uint8_t> meta_, info_, blob_;
};

}  // namespace cb::test
