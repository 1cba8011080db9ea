// Scalar dequantization of GGUF weight rows to f32.  This is the reference
// for every fused kernel: it reproduces the gguf Python package (and ggml)
// bit for bit, because it performs the same f32 operations in the same order.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace cb {

// dst[0..n) = the n elements stored at src.  n must be a multiple of
// dtype_block_elems(t); throws cb::Error(kInvalidArgument) otherwise and
// cb::Error(kUnsupported) for a type outside DType.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace cb
