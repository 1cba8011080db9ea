#include "kernels/dtype.h"

#include <gtest/gtest.h>

#include <string>

#include "kernels/cpu/quant_blocks.h"
#include "platform/error.h"

namespace cb {
namespace {

TEST(DType, GeometryMatchesGgml) {
  struct Row {
    DType t;
    const char* name;
    int64_t elems;
    size_t bytes;
  };
  const Row rows[] = {
      {DType::F32, "F32", 1, 4},
      {DType::F16, "F16", 1, 2},
      {DType::BF16, "BF16", 1, 2},
      {DType::Q4_0, "Q4_0", 32, sizeof(BlockQ4_0)},
      {DType::Q4_1, "Q4_1", 32, sizeof(BlockQ4_1)},
      {DType::Q5_0, "Q5_0", 32, sizeof(BlockQ5_0)},
      {DType::Q5_1, "Q5_1", 32, sizeof(BlockQ5_1)},
      {DType::Q8_0, "Q8_0", 32, sizeof(BlockQ8_0)},
      {DType::Q4_K, "Q4_K", 256, sizeof(BlockQ4_K)},
      {DType::Q5_K, "Q5_K", 256, sizeof(BlockQ5_K)},
      {DType::Q6_K, "Q6_K", 256, sizeof(BlockQ6_K)},
      {DType::Q2_K, "Q2_K", 256, sizeof(BlockQ2_K)},
      {DType::Q3_K, "Q3_K", 256, sizeof(BlockQ3_K)},
      {DType::IQ4_NL, "IQ4_NL", 32, sizeof(BlockIQ4_NL)},
      {DType::IQ4_XS, "IQ4_XS", 256, sizeof(BlockIQ4_XS)},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_TRUE(dtype_supported(static_cast<uint32_t>(r.t)));
    EXPECT_STREQ(dtype_name(r.t), r.name);
    EXPECT_EQ(dtype_block_elems(r.t), r.elems);
    EXPECT_EQ(dtype_block_bytes(r.t), r.bytes);
    EXPECT_EQ(dtype_row_bytes(r.t, 4 * r.elems), 4 * r.bytes);
  }
  // Spot values straight from the GGUF spec.
  EXPECT_EQ(dtype_row_bytes(DType::Q4_1, 576), 18u * 20u);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 1536), 6u * 210u);
}

TEST(DType, RejectsOtherTypes) {
  for (uint32_t id : {4u, 5u, 9u, 15u, 16u, 21u, 29u, 31u, 1000u}) {
    EXPECT_FALSE(dtype_supported(id)) << id;
  }
  try {
    dtype_block_bytes(static_cast<DType>(21));  // IQ3_S
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

TEST(DType, RowBytesNeedsWholeBlocks) {
  EXPECT_THROW(dtype_row_bytes(DType::Q4_0, 33), Error);
  EXPECT_THROW(dtype_row_bytes(DType::Q4_K, 128), Error);
  EXPECT_EQ(dtype_row_bytes(DType::F16, 7), 14u);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 0), 0u);
}

}  // namespace
}  // namespace cb
