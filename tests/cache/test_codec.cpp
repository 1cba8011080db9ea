// Codec round trips against each codec's stated error bound (cache/codec.h),
// input validation, and robustness to malformed segments.
#include "cache/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cache_test_util.h"
#include "platform/error.h"
#include "platform/half.h"

namespace cb::cache {
namespace {

using testing::make_kv;
using testing::q4_bound;
using testing::q8_bound;

struct Decoded {
  std::vector<float> k, v;
};

Decoded round_trip(Codec codec, const KvShape& s, const float* k, const float* v, int level) {
  std::vector<uint8_t> seg;
  encode_layer(codec, s, k, v, level, seg);
  Decoded d{std::vector<float>(s.layer_floats(), -999.0f),
            std::vector<float>(s.layer_floats(), -999.0f)};
  decode_layer(codec, s, seg.data(), seg.size(), d.k.data(), d.v.data());
  return d;
}

class CodecRoundTrip : public ::testing::TestWithParam<KvShape> {};

TEST_P(CodecRoundTrip, F16IsExactF16Rounding) {
  const KvShape s = GetParam();
  const ChunkKV kv = make_kv({1, s.n_tokens, s.n_head_kv, s.head_dim}, 1);
  for (int level : {0, 1}) {
    const Decoded d = round_trip(Codec::kF16, s, kv.k.data(), kv.v.data(), level);
    for (int64_t i = 0; i < s.layer_floats(); ++i) {
      ASSERT_EQ(d.k[i], f16_to_f32(f32_to_f16(kv.k[i]))) << i;
      ASSERT_EQ(d.v[i], f16_to_f32(f32_to_f16(kv.v[i]))) << i;
    }
  }
}

TEST_P(CodecRoundTrip, Q8WithinBound) {
  const KvShape s = GetParam();
  const ChunkKV kv = make_kv({1, s.n_tokens, s.n_head_kv, s.head_dim}, 2);
  const Decoded d = round_trip(Codec::kQ8, s, kv.k.data(), kv.v.data(), 1);
  const int hd = s.head_dim;
  double worst_ratio = 0;  // error / bound, to show the bound is not vacuous
  for (int64_t g = 0; g < int64_t{s.n_tokens} * s.n_head_kv; ++g) {
    for (const auto& [in, out] : {std::pair{kv.k.data(), d.k.data()}, {kv.v.data(), d.v.data()}}) {
      const double bound = q8_bound(in + g * hd, hd);
      for (int j = 0; j < hd; ++j) {
        const double err = std::fabs(double{out[g * hd + j]} - in[g * hd + j]);
        ASSERT_LE(err, bound) << "group " << g << " j " << j;
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
  }
  if (s.layer_floats() >= 64) {
    EXPECT_GT(worst_ratio, 0.5);  // the data exercises the bound
  }
}

TEST_P(CodecRoundTrip, Q4WithinBound) {
  const KvShape s = GetParam();
  const ChunkKV kv = make_kv({1, s.n_tokens, s.n_head_kv, s.head_dim}, 3);
  const Decoded d = round_trip(Codec::kQ4, s, kv.k.data(), kv.v.data(), 1);
  const int64_t D = s.kv_dim();
  double worst_ratio = 0;
  // K: per channel over groups of kQ4KGroupTokens tokens.
  for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kQ4KGroupTokens) {
    const int64_t t1 = std::min<int64_t>(s.n_tokens, t0 + kQ4KGroupTokens);
    for (int64_t c = 0; c < D; ++c) {
      double lo = kv.k[t0 * D + c], hi = lo;
      for (int64_t t = t0; t < t1; ++t) {
        lo = std::min<double>(lo, kv.k[t * D + c]);
        hi = std::max<double>(hi, kv.k[t * D + c]);
      }
      const double bound = q4_bound(lo, hi);
      for (int64_t t = t0; t < t1; ++t) {
        const double err = std::fabs(double{d.k[t * D + c]} - kv.k[t * D + c]);
        ASSERT_LE(err, bound) << "K t " << t << " c " << c;
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
  }
  // V: per (token, head).
  const int hd = s.head_dim;
  for (int64_t g = 0; g < int64_t{s.n_tokens} * s.n_head_kv; ++g) {
    const float* x = kv.v.data() + g * hd;
    const auto [lo, hi] = std::minmax_element(x, x + hd);
    const double bound = q4_bound(*lo, *hi);
    for (int j = 0; j < hd; ++j) {
      const double err = std::fabs(double{d.v[g * hd + j]} - x[j]);
      ASSERT_LE(err, bound) << "V group " << g << " j " << j;
      worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  if (s.layer_floats() >= 64) {
    EXPECT_GT(worst_ratio, 0.5);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CodecRoundTrip,
                         ::testing::Values(KvShape{1, 40, 3, 8},      // partial q4 K group
                                           KvShape{1, 1, 1, 1},       // smallest
                                           KvShape{1, 33, 2, 5},      // odd kv_dim
                                           KvShape{1, 512, 3, 64}));  // the default model

TEST(Codec, ZeroIsExactAndConstantGroupsAreExactWithAnOffset) {
  const KvShape s{1, 40, 2, 4};
  std::vector<float> zeros(s.layer_floats(), 0.0f), ones(s.layer_floats(), 0.75f);
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    const Decoded d = round_trip(c, s, zeros.data(), ones.data(), 1);
    for (int64_t i = 0; i < s.layer_floats(); ++i) {
      ASSERT_EQ(d.k[i], 0.0f) << codec_name(c);
      // q8 is symmetric (no offset): 0.75 lands on a multiple of its scale.
      if (c != Codec::kQ8) {
        ASSERT_EQ(d.v[i], 0.75f) << codec_name(c);
      }
    }
  }
}

TEST(Codec, RejectsValuesItCannotHold) {
  const KvShape s{1, 2, 1, 4};
  std::vector<float> ok(s.layer_floats(), 1.0f);
  for (float bad : {NAN, INFINITY, -INFINITY, 1e6f}) {
    std::vector<float> k = ok;
    k[5] = bad;
    for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
      if (c == Codec::kQ8 && bad == 1e6f) continue;  // q8 holds it: scale 1e6/127 fits f16
      std::vector<uint8_t> seg;
      try {
        encode_layer(c, s, k.data(), ok.data(), 1, seg);
        ADD_FAILURE() << codec_name(c) << " accepted " << bad;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      }
    }
  }
}

TEST(Codec, ZstdShrinksQuantizedSegmentsOfSmoothData) {
  // Nearly constant data compresses well; check the container switches to
  // zstd and still round-trips, and that level 0 keeps it raw.
  const KvShape s{1, 256, 2, 64};
  std::vector<float> k(s.layer_floats()), v(s.layer_floats());
  for (size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i % 3);
  std::vector<uint8_t> raw, z;
  encode_layer(Codec::kQ8, s, k.data(), v.data(), 0, raw);
  encode_layer(Codec::kQ8, s, k.data(), v.data(), 3, z);
  EXPECT_EQ(raw[0], 0);
  EXPECT_EQ(z[0], 1);
  EXPECT_LT(z.size() * 4, raw.size());
  std::vector<float> k_raw(k.size()), v_raw(v.size()), k_z(k.size()), v_z(v.size());
  decode_layer(Codec::kQ8, s, raw.data(), raw.size(), k_raw.data(), v_raw.data());
  decode_layer(Codec::kQ8, s, z.data(), z.size(), k_z.data(), v_z.data());
  EXPECT_EQ(k_z, k_raw);
  EXPECT_EQ(v_z, v_raw);
  // f16 stays raw whatever the level.
  std::vector<uint8_t> f16;
  encode_layer(Codec::kF16, s, k.data(), v.data(), 3, f16);
  EXPECT_EQ(f16[0], 0);
}

TEST(Codec, MalformedSegmentsThrowFormatErrorNeverCrash) {
  const KvShape s{1, 40, 3, 8};
  const ChunkKV kv = make_kv(s, 4);
  std::vector<float> k(s.layer_floats()), v(s.layer_floats());
  std::mt19937 rng(7);
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    std::vector<uint8_t> seg;
    encode_layer(c, s, kv.k.data(), kv.v.data(), 1, seg);
    auto expect_format = [&](const std::vector<uint8_t>& bad, const char* what) {
      try {
        decode_layer(c, s, bad.data(), bad.size(), k.data(), v.data());
        ADD_FAILURE() << codec_name(c) << ": " << what << " decoded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kFormat) << what;
      }
    };
    expect_format(std::vector<uint8_t>(seg.begin(), seg.begin() + seg.size() / 2), "truncated");
    expect_format(std::vector<uint8_t>(seg.begin(), seg.begin() + 3), "shorter than header");
    std::vector<uint8_t> longer = seg;
    longer.push_back(0);
    if (seg[0] == 0) expect_format(longer, "trailing byte");
    std::vector<uint8_t> other = seg;
    other[1] = static_cast<uint8_t>(c == Codec::kF16 ? Codec::kQ8 : Codec::kF16);
    expect_format(other, "codec mismatch");
    other = seg;
    other[0] = 7;
    expect_format(other, "unknown container");
    // Wrong shape for the same bytes.
    try {
      decode_layer(c, {1, 41, 3, 8}, seg.data(), seg.size(), k.data(), v.data());
      ADD_FAILURE() << "shape mismatch decoded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat);
    }
    // Random damage past the header: may decode (checksums catch that in the
    // store) or throw kFormat, but must stay in bounds (ASan checks).
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> bad = seg;
      const size_t pos = kSegmentHeaderBytes + rng() % (bad.size() - kSegmentHeaderBytes);
      bad[pos] ^= static_cast<uint8_t>(1 + rng() % 255);
      try {
        decode_layer(c, s, bad.data(), bad.size(), k.data(), v.data());
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kFormat);
      }
    }
  }
}

TEST(Codec, NamesParse) {
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) EXPECT_EQ(parse_codec(codec_name(c)), c);
  EXPECT_FALSE(parse_codec("q5"));
}

}  // namespace
}  // namespace cb::cache
