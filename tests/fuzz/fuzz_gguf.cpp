// libFuzzer target: any byte string given to the GGUF parser must either
// parse or throw cb::Error -- never crash, read out of bounds or allocate
// without bound.  Parsed files are also walked through every getter.
#include <cstddef>
#include <cstdint>

#include "platform/error.h"
#include "runtime/gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    cb::GgufFile f = cb::GgufFile::parse(data, size);
    for (const std::string& k : f.keys()) {
      try {
        switch (*f.type_of(k)) {
          case cb::GgufType::kString:
            f.get_string(k);
            break;
          case cb::GgufType::kArray:
            f.get_string_array(k);
            break;
          case cb::GgufType::kFloat32:
          case cb::GgufType::kFloat64:
            f.get_float(k);
            break;
          case cb::GgufType::kBool:
            f.get_bool(k);
            break;
          default:
            f.get_int(k);
            break;
        }
      } catch (const cb::Error&) {
      }
      try {
        f.get_int_array(k);
      } catch (const cb::Error&) {
      }
      try {
        f.get_float_array(k);
      } catch (const cb::Error&) {
      }
    }
    // Touch the last byte of every tensor: ASan flags it if a bounds check
    // let a tensor reach past the buffer.
    uint8_t sink = 0;
    for (const cb::GgufTensor& t : f.tensors())
      if (t.n_bytes) sink ^= static_cast<const uint8_t*>(t.data)[t.n_bytes - 1];
    asm volatile("" : : "r"(sink));
  } catch (const cb::Error&) {
  }
  return 0;
}
