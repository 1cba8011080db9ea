// The per-type block geometry, exactly as ggml lays the types out on disk
// (ggml-common.h / the GGUF spec).  The byte counts must match the block
// structs in cpu/quant_blocks.h; that header static_asserts the sizes, and
// the dtype test checks the two agree.
#include "kernels/dtype.h"

#include <string>

#include "platform/error.h"

namespace cb {
namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  int64_t block_elems;
  size_t block_bytes;
};

// F32/F16/BF16 are "blocks" of one element so every type shares one row-size
// formula.  K-quants use 256-element super-blocks.
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 1, 4},         {DType::F16, "F16", 1, 2},
    {DType::Q4_0, "Q4_0", 32, 18},     {DType::Q4_1, "Q4_1", 32, 20},
    {DType::Q5_0, "Q5_0", 32, 22},     {DType::Q5_1, "Q5_1", 32, 24},
    {DType::Q8_0, "Q8_0", 32, 34},     {DType::Q4_K, "Q4_K", 256, 144},
    {DType::Q6_K, "Q6_K", 256, 210},   {DType::Q5_K, "Q5_K", 256, 176},
    {DType::Q2_K, "Q2_K", 256, 84},    {DType::Q3_K, "Q3_K", 256, 110},
    {DType::IQ4_NL, "IQ4_NL", 32, 18}, {DType::IQ4_XS, "IQ4_XS", 256, 136},
    {DType::BF16, "BF16", 1, 2},
};

const DTypeInfo* find(uint32_t ggml_type) {
  for (const DTypeInfo& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == ggml_type) return &info;
  }
  return nullptr;
}

const DTypeInfo& info_of(DType t) {
  const DTypeInfo* info = find(static_cast<uint32_t>(t));
  if (info == nullptr) {
    fail(ErrorCode::kUnsupported,
         "unsupported tensor type " + std::to_string(static_cast<uint32_t>(t)));
  }
  return *info;
}

}  // namespace

bool dtype_supported(uint32_t ggml_type) {
  return find(ggml_type) != nullptr;
}

const char* dtype_name(DType t) {
  const DTypeInfo* info = find(static_cast<uint32_t>(t));
  return info != nullptr ? info->name : "unknown";
}

int64_t dtype_block_elems(DType t) {
  return info_of(t).block_elems;
}

size_t dtype_block_bytes(DType t) {
  return info_of(t).block_bytes;
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = info_of(t);
  if (n < 0 || n % info.block_elems != 0) {
    fail(ErrorCode::kInvalidArgument, std::string("row of ") + std::to_string(n) +
                                          " elements is not a whole number of " + info.name +
                                          " blocks");
  }
  return static_cast<size_t>(n / info.block_elems) * info.block_bytes;
}

}  // namespace cb
