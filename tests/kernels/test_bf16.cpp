// bfloat16 conversions (binary16 is platform/half.h's and tested with it).
#include "kernels/cpu/bf16.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cb {
namespace {

TEST(Bf16, ConversionsRoundToNearestEven) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-7f), 0x3F81);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7F80);  // rounds past the largest finite -> inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Bf16, EveryValueRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if ((h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << i;
  }
}

}  // namespace
}  // namespace cb
