// libFuzzer target: the chunk-KV layer codecs (cache/codec.h) on values and
// segments chosen by the fuzzer.
//
// Input: codec (f16, q8 or q4), a small shape, the position and byte of one
// damaged segment byte, how many bytes to cut from the segment's end, then
// the K and V values as raw f32 bits (repeated to fill the shape).  Checks:
//   - encode accepts every finite value inside the codec's range and refuses
//     others with kInvalidArgument;
//   - decode of the encoded segment stays within the error bound codec.h
//     states for each group (f16: exactly the f16 rounding);
//   - the segment cut short fails with kFormat; with one byte changed, and
//     the input's own bytes as a segment, it decodes or fails with kFormat;
//     never out of bounds (ASan).
//
//   build-fuzz/bin/fuzz_kv_codec -max_total_time=60
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cache/codec.h"
#include "platform/error.h"
#include "platform/half.h"
#include "tests/cache/cache_test_util.h"

namespace {

using cb::cache::Codec;
using cb::cache::KvShape;
using cb::cache::testing::q4_bound;
using cb::cache::testing::q8_bound;

// codec, tokens, heads, head_dim, damage position (2), damage byte, cut
constexpr size_t kHeader = 8;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_kv_codec: %s\n", what);
  std::abort();
}

// decode_layer on any bytes: decoded, or cb::Error(kFormat).
void decode_or_format_error(Codec codec, const KvShape& s, const uint8_t* seg, size_t n,
                            std::vector<float>& k, std::vector<float>& v) {
  try {
    cb::cache::decode_layer(codec, s, seg, n, k.data(), v.data());
  } catch (const cb::Error& e) {
    require(e.code() == cb::ErrorCode::kFormat, "decode threw an error other than kFormat");
  }
}

// The largest |x| each codec takes (codec.h).
float range_of(Codec codec) {
  return codec == Codec::kQ8 ? 65504.0f * 127.0f : 65504.0f;
}

// One q4 group: n values `stride` floats apart, decoded within the group's bound.
void check_q4_group(const float* in, const float* out, int64_t n, int64_t stride) {
  double lo = in[0], hi = in[0];
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min<double>(lo, in[i * stride]);
    hi = std::max<double>(hi, in[i * stride]);
  }
  const double bound = q4_bound(lo, hi);
  for (int64_t i = 0; i < n; ++i)
    require(std::fabs(double{out[i * stride]} - in[i * stride]) <= bound,
            "q4 decode outside its bound");
}

void check_round_trip(Codec codec, const KvShape& s, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<float>& dk,
                      const std::vector<float>& dv) {
  const int hd = s.head_dim;
  const int64_t groups = int64_t{s.n_tokens} * s.n_head_kv;  // (token, head) rows
  for (const auto& [in, out] : {std::pair{&k, &dk}, std::pair{&v, &dv}}) {
    const bool is_k = in == &k;
    switch (codec) {
      case Codec::kF16:
        for (size_t i = 0; i < in->size(); ++i)
          require((*out)[i] == cb::f16_to_f32(cb::f32_to_f16((*in)[i])),
                  "f16 decode is not the f16 rounding");
        break;
      case Codec::kQ8:
        for (int64_t g = 0; g < groups; ++g) {
          const double bound = q8_bound(in->data() + g * hd, hd);
          for (int j = 0; j < hd; ++j)
            require(std::fabs(double{(*out)[g * hd + j]} - (*in)[g * hd + j]) <= bound,
                    "q8 decode outside its bound");
        }
        break;
      case Codec::kQ4:
        if (is_k) {
          // K: one channel over kQ4KGroupTokens consecutive tokens.
          const int64_t dim = s.kv_dim();
          for (int64_t t0 = 0; t0 < s.n_tokens; t0 += cb::cache::kQ4KGroupTokens) {
            const int64_t n = std::min<int64_t>(s.n_tokens - t0, cb::cache::kQ4KGroupTokens);
            for (int64_t c = 0; c < dim; ++c)
              check_q4_group(in->data() + t0 * dim + c, out->data() + t0 * dim + c, n, dim);
          }
        } else {
          for (int64_t g = 0; g < groups; ++g)
            check_q4_group(in->data() + g * hd, out->data() + g * hd, hd, 1);
        }
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeader) return 0;
  const Codec codec = static_cast<Codec>(1 + data[0] % 3);
  // 1..40 tokens (two q4 K groups, the second partial), 1..4 heads of 1..16.
  const KvShape s{1, 1 + data[1] % 40, 1 + data[2] % 4, 1 + data[3] % 16};
  const size_t damage_at = size_t{data[4]} | size_t{data[5]} << 8;
  const uint8_t damage = data[6];
  const size_t cut = data[7];
  const uint8_t* values = data + kHeader;
  const size_t n_values = (size - kHeader) / 4;

  std::vector<float> dk(s.layer_floats()), dv(s.layer_floats());
  // The input's own value bytes as a segment.
  decode_or_format_error(codec, s, values, size - kHeader, dk, dv);
  if (n_values == 0) return 0;

  std::vector<float> k(s.layer_floats()), v(s.layer_floats());
  bool in_range = true;
  for (int64_t i = 0; i < 2 * s.layer_floats(); ++i) {
    float x;
    std::memcpy(&x, values + 4 * (static_cast<size_t>(i) % n_values), 4);
    (i < s.layer_floats() ? k[i] : v[i - s.layer_floats()]) = x;
    in_range = in_range && std::fabs(x) <= range_of(codec);
  }
  std::vector<uint8_t> seg;
  try {
    cb::cache::encode_layer(codec, s, k.data(), v.data(), /*zstd_level=*/1, seg);
  } catch (const cb::Error& e) {
    require(!in_range, "encode refused values inside the codec's range");
    require(e.code() == cb::ErrorCode::kInvalidArgument,
            "encode threw other than kInvalidArgument");
    return 0;
  }
  require(in_range, "encode took a value outside the codec's range");
  cb::cache::decode_layer(codec, s, seg.data(), seg.size(), dk.data(), dv.data());
  check_round_trip(codec, s, k, v, dk, dv);

  if (cut > 0) {
    // An exact-size copy, so that ASan sees a read past its end.
    const std::vector<uint8_t> short_seg(seg.begin(), seg.end() - std::min(cut, seg.size()));
    try {
      cb::cache::decode_layer(codec, s, short_seg.data(), short_seg.size(), dk.data(), dv.data());
      require(false, "a segment cut short decoded");
    } catch (const cb::Error& e) {
      require(e.code() == cb::ErrorCode::kFormat, "a short segment threw other than kFormat");
    }
  }
  seg[damage_at % seg.size()] ^= damage;
  decode_or_format_error(codec, s, seg.data(), seg.size(), dk, dv);
  return 0;
}
