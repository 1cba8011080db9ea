// Element types of weight tensors, numbered as in GGUF/ggml so a file's type
// field maps onto them directly.  Activations are always f32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cb {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
};

// True when `ggml_type` is one of the DType values above.
bool dtype_supported(uint32_t ggml_type);
// Name as GGUF tools print it ("Q4_1"); "unknown(N)" style text is the
// caller's business for unsupported ids.
const char* dtype_name(DType t);
// Elements per block (1 for F32/F16/BF16, 32 for Q*_0/Q*_1 and IQ4_NL, 256 for
// K-quants and IQ4_XS).
int64_t dtype_block_elems(DType t);
// Bytes per block.
size_t dtype_block_bytes(DType t);
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace cb
