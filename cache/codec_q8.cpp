// q8 codec: symmetric int8 per (token, head) with an f16 scale.  Layout:
//   K scales [T x H] f16 | V scales [T x H] f16 | K int8 [T x D] | V int8 [T x D]
// Scales first keeps every f16 array 2-byte aligned within the payload.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cache/codec_impl.h"
#include "platform/half.h"

namespace cb::cache::detail {
namespace {

// Largest |x| whose scale (|x| / 127) still fits an f16.
constexpr float kQ8Limit = 65504.0f * 127.0f;

void encode_part(const KvShape& s, const float* x, uint8_t* scales, int8_t* q) {
  const int64_t hd = s.head_dim;
  const int64_t groups = int64_t{s.n_tokens} * s.n_head_kv;
  for (int64_t g = 0; g < groups; ++g) {
    const float* row = x + g * hd;
    float amax = 0.0f;
    for (int64_t j = 0; j < hd; ++j) amax = std::max(amax, std::fabs(row[j]));
    const uint16_t s16 = f16_round_up(amax / 127.0f);
    std::memcpy(scales + 2 * g, &s16, 2);
    const float scale = f16_to_f32(s16);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t j = 0; j < hd; ++j) {
      const float r = std::nearbyint(row[j] * inv);
      q[g * hd + j] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void decode_part(const KvShape& s, const uint8_t* scales, const int8_t* q, float* x) {
  const int64_t hd = s.head_dim;
  const int64_t groups = int64_t{s.n_tokens} * s.n_head_kv;
  thread_local std::vector<float> sf;
  sf.resize(static_cast<size_t>(groups));
  f16_to_f32_n(scales, sf.data(), sf.size());
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = sf[g];
    const int8_t* in = q + g * hd;
    float* out = x + g * hd;
    for (int64_t j = 0; j < hd; ++j) out[j] = static_cast<float>(in[j]) * scale;
  }
}

}  // namespace

size_t q8_payload_bytes(const KvShape& s) {
  const size_t groups = static_cast<size_t>(s.n_tokens) * s.n_head_kv;
  return 2 * (2 * groups + static_cast<size_t>(s.layer_floats()));
}

void q8_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst) {
  const size_t n = static_cast<size_t>(s.layer_floats());
  const size_t groups = static_cast<size_t>(s.n_tokens) * s.n_head_kv;
  check_finite(k, n, kQ8Limit);
  check_finite(v, n, kQ8Limit);
  uint8_t* k_scales = dst;
  uint8_t* v_scales = dst + 2 * groups;
  auto* k_q = reinterpret_cast<int8_t*>(dst + 4 * groups);
  encode_part(s, k, k_scales, k_q);
  encode_part(s, v, v_scales, k_q + n);
}

void q8_decode(const KvShape& s, const uint8_t* src, float* k, float* v) {
  const size_t n = static_cast<size_t>(s.layer_floats());
  const size_t groups = static_cast<size_t>(s.n_tokens) * s.n_head_kv;
  const auto* k_q = reinterpret_cast<const int8_t*>(src + 4 * groups);
  decode_part(s, src, k_q, k);
  decode_part(s, src + 2 * groups, k_q + n, v);
}

}  // namespace cb::cache::detail
