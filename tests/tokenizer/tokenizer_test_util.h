// Helpers shared by the tokenizer tests: the real model's tokenizer and a
// minimal GGUF writer for metadata-only files built in memory.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/gguf/gguf_file.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/vocab_gguf.h"

namespace cb::test {

inline std::string model_path() {
  const char* env = std::getenv("CB_MODEL");
  return env && *env ? env : CB_DEFAULT_MODEL;
}

// The default model's tokenizer, loaded once per test binary.
inline const Tokenizer& model_tokenizer() {
  static const Tokenizer tokenizer = [] {
    const GgufFile file = GgufFile::open(model_path());
    return Tokenizer(read_tokenizer_vocab(file));
  }();
  return tokenizer;
}

// Writes GGUF v3 metadata (no tensors), enough to exercise the vocab reader.
class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& value) {
    key_(key, GgufType::kString);
    str_(value);
    ++n_kv_;
  }
  void add_u32(const std::string& key, uint32_t value) {
    key_(key, GgufType::kUint32);
    pod_(value);
    ++n_kv_;
  }
  void add_bool(const std::string& key, bool value) {
    key_(key, GgufType::kBool);
    pod_(static_cast<uint8_t>(value));
    ++n_kv_;
  }
  void add_strings(const std::string& key, const std::vector<std::string>& values) {
    array_header_(key, GgufType::kString, values.size());
    for (const auto& v : values) str_(v);
  }
  void add_floats(const std::string& key, const std::vector<float>& values) {
    array_header_(key, GgufType::kFloat32, values.size());
    for (float v : values) pod_(v);
  }
  void add_i32s(const std::string& key, const std::vector<int32_t>& values) {
    array_header_(key, GgufType::kInt32, values.size());
    for (int32_t v : values) pod_(v);
  }

  // The finished file; keep it alive while a GgufFile parsed from it is used.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    const auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    put("GGUF", 4);
    const uint32_t version = 3;
    const uint64_t n_tensors = 0;
    put(&version, 4);
    put(&n_tensors, 8);
    put(&n_kv_, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    out.resize((out.size() + 31) / 32 * 32, 0);  // the data section starts aligned
    return out;
  }

 private:
  template <typename T>
  void pod_(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), b, b + sizeof(T));
  }
  void str_(const std::string& s) {
    pod_(static_cast<uint64_t>(s.size()));
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void key_(const std::string& key, GgufType type) {
    str_(key);
    pod_(static_cast<uint32_t>(type));
  }
  void array_header_(const std::string& key, GgufType elem, size_t n) {
    key_(key, GgufType::kArray);
    pod_(static_cast<uint32_t>(elem));
    pod_(static_cast<uint64_t>(n));
    ++n_kv_;
  }

  std::vector<uint8_t> body_;
  uint64_t n_kv_ = 0;
};

}  // namespace cb::test
