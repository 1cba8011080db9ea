// platform/half: binary16 conversion, checked against the compiler's _Float16
// where available and against exhaustive round-trip identities.
#include "platform/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace cb {
namespace {

TEST(Half, EveryF16SurvivesARoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // ties to even rounds up to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie to even: down
  EXPECT_EQ(f32_to_f16(1.0f + 0x3p-11f), 0x3c02);  // tie to even: up
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(Half, MatchesCompilerConversionOnRandomFloats) {
#ifdef __FLT16_MAX__
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(ref)) << f;
  }
#else
  GTEST_SKIP() << "compiler has no _Float16";
#endif
}

TEST(Half, BulkMatchesScalarAtAnyAlignment) {
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 100.0f);
  std::vector<float> src(1003);
  for (float& x : src) x = n(rng);
  src[5] = 1e-7f;  // subnormal result
  std::vector<uint8_t> buf(2 * src.size() + 1);
  for (int offset : {0, 1}) {
    f32_to_f16_n(src.data(), buf.data() + offset, src.size());
    std::vector<float> back(src.size());
    f16_to_f32_n(buf.data() + offset, back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, buf.data() + offset + 2 * i, 2);
      ASSERT_EQ(h, f32_to_f16(src[i])) << i;
      ASSERT_EQ(back[i], f16_to_f32(h)) << i;
    }
  }
}

}  // namespace
}  // namespace cb
