// q4 codec: asymmetric 4-bit (offset + scale per group, both f16).
//   K: groups are one channel over kQ4KGroupTokens consecutive tokens.  Keys
//      carry large per-channel offsets and outlier channels; a per-channel
//      group spends its 16 levels on that channel's own range (KIVI's finding).
//   V: groups are one (token, head); values have no channel structure.
// Layout (G = ceil(T / kQ4KGroupTokens), R = ceil(D / 2) bytes per row):
//   K offsets [G x D] | K scales [G x D] | V offsets [T x H] | V scales [T x H]
//   (all f16) | K nibbles [T x R] | V nibbles [T x R]
// Nibbles stay row-major (low nibble = even channel) so decoding writes each
// output row once, in order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cache/codec.h"
#include "cache/codec_impl.h"
#include "platform/half.h"

namespace cb::cache::detail {
namespace {

int64_t k_groups(const KvShape& s) {
  return (s.n_tokens + kQ4KGroupTokens - 1) / kQ4KGroupTokens;
}
int64_t row_bytes(const KvShape& s) {
  return (s.kv_dim() + 1) / 2;
}

// Offset (rounded down) and scale (rounded up) so that every x in [lo, hi]
// maps into [0, 15].
void group_params(float lo, float hi, uint16_t* off16, uint16_t* scale16) {
  *off16 = f16_round_down(lo);
  *scale16 = f16_round_up((hi - f16_to_f32(*off16)) / 15.0f);
}

uint8_t quantize(float x, float off, float inv) {
  const float r = std::nearbyint((x - off) * inv);
  return static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
}

void set_nibble(uint8_t* row, int64_t c, uint8_t q) {
  row[c / 2] = static_cast<uint8_t>((c & 1) ? (row[c / 2] | (q << 4)) : (row[c / 2] | q));
}

void store16(uint8_t* base, int64_t i, uint16_t h) {
  std::memcpy(base + 2 * i, &h, 2);
}

void encode_k(const KvShape& s, const float* k, uint8_t* offs, uint8_t* scales, uint8_t* nib) {
  const int64_t D = s.kv_dim();
  const int64_t T = s.n_tokens;
  for (int64_t g = 0; g < k_groups(s); ++g) {
    const int64_t t0 = g * kQ4KGroupTokens;
    const int64_t t1 = std::min<int64_t>(T, t0 + kQ4KGroupTokens);
    for (int64_t c = 0; c < D; ++c) {
      float lo = k[t0 * D + c], hi = lo;
      for (int64_t t = t0 + 1; t < t1; ++t) {
        lo = std::min(lo, k[t * D + c]);
        hi = std::max(hi, k[t * D + c]);
      }
      uint16_t o16, s16;
      group_params(lo, hi, &o16, &s16);
      store16(offs, g * D + c, o16);
      store16(scales, g * D + c, s16);
      const float off = f16_to_f32(o16), scale = f16_to_f32(s16);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t t = t0; t < t1; ++t) {
        set_nibble(nib + t * row_bytes(s), c, quantize(k[t * D + c], off, inv));
      }
    }
  }
}

void encode_v(const KvShape& s, const float* v, uint8_t* offs, uint8_t* scales, uint8_t* nib) {
  const int64_t hd = s.head_dim;
  const int64_t H = s.n_head_kv;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* x = v + (t * H + h) * hd;
      float lo = x[0], hi = x[0];
      for (int64_t j = 1; j < hd; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
      }
      uint16_t o16, s16;
      group_params(lo, hi, &o16, &s16);
      store16(offs, t * H + h, o16);
      store16(scales, t * H + h, s16);
      const float off = f16_to_f32(o16), scale = f16_to_f32(s16);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t j = 0; j < hd; ++j) {
        set_nibble(nib + t * row_bytes(s), h * hd + j, quantize(x[j], off, inv));
      }
    }
  }
}

// Expands one packed row given per-channel offset and scale arrays.
void decode_row(const uint8_t* nib, const float* off, const float* scale, int64_t D, float* out) {
  int64_t c = 0;
  for (; c + 1 < D; c += 2) {
    const uint8_t b = nib[c / 2];
    out[c] = off[c] + static_cast<float>(b & 15) * scale[c];
    out[c + 1] = off[c + 1] + static_cast<float>(b >> 4) * scale[c + 1];
  }
  if (c < D) out[c] = off[c] + static_cast<float>(nib[c / 2] & 15) * scale[c];
}

}  // namespace

size_t q4_payload_bytes(const KvShape& s) {
  const size_t params =
      2 * 2 * static_cast<size_t>(k_groups(s) * s.kv_dim() + int64_t{s.n_tokens} * s.n_head_kv);
  return params + 2 * static_cast<size_t>(s.n_tokens * row_bytes(s));
}

void q4_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst) {
  const size_t n = static_cast<size_t>(s.layer_floats());
  check_finite(k, n, 65504.0f);
  check_finite(v, n, 65504.0f);
  const int64_t kp = k_groups(s) * s.kv_dim();
  const int64_t vp = int64_t{s.n_tokens} * s.n_head_kv;
  uint8_t* k_off = dst;
  uint8_t* k_scale = k_off + 2 * kp;
  uint8_t* v_off = k_scale + 2 * kp;
  uint8_t* v_scale = v_off + 2 * vp;
  uint8_t* k_nib = v_scale + 2 * vp;
  uint8_t* v_nib = k_nib + s.n_tokens * row_bytes(s);
  std::memset(k_nib, 0, 2 * static_cast<size_t>(s.n_tokens * row_bytes(s)));
  encode_k(s, k, k_off, k_scale, k_nib);
  encode_v(s, v, v_off, v_scale, v_nib);
}

void q4_decode(const KvShape& s, const uint8_t* src, float* k, float* v) {
  const int64_t D = s.kv_dim();
  const int64_t H = s.n_head_kv;
  const int64_t hd = s.head_dim;
  const int64_t kp = k_groups(s) * D;
  const int64_t vp = int64_t{s.n_tokens} * H;
  thread_local std::vector<float> params;
  params.resize(static_cast<size_t>(2 * kp + 2 * vp));
  f16_to_f32_n(src, params.data(), params.size());  // the four arrays are contiguous
  const float* k_off = params.data();
  const float* k_scale = k_off + kp;
  const float* v_off = k_scale + kp;
  const float* v_scale = v_off + vp;
  const uint8_t* k_nib = src + 2 * params.size();
  const uint8_t* v_nib = k_nib + s.n_tokens * row_bytes(s);

  for (int64_t t = 0; t < s.n_tokens; ++t) {
    const int64_t g = t / kQ4KGroupTokens;
    decode_row(k_nib + t * row_bytes(s), k_off + g * D, k_scale + g * D, D, k + t * D);
  }
  // V's parameters are per head; expand them to per-channel rows once per
  // token so the same row decoder serves both.
  thread_local std::vector<float> row_off, row_scale;
  row_off.resize(static_cast<size_t>(D));
  row_scale.resize(static_cast<size_t>(D));
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      std::fill_n(row_off.begin() + h * hd, hd, v_off[t * H + h]);
      std::fill_n(row_scale.begin() + h * hd, hd, v_scale[t * H + h]);
    }
    decode_row(v_nib + t * row_bytes(s), row_off.data(), row_scale.data(), D, v + t * D);
  }
}

}  // namespace cb::cache::detail
