// f16 codec: K then V as raw binary16, no zstd (f16 KV barely compresses and
// the raw form decodes at memory speed).
#include "cache/codec_impl.h"
#include "platform/half.h"

namespace cb::cache::detail {

size_t f16_payload_bytes(const KvShape& s) {
  return 2 * 2 * static_cast<size_t>(s.layer_floats());
}

void f16_encode(const KvShape& s, const float* k, const float* v, uint8_t* dst) {
  const size_t n = static_cast<size_t>(s.layer_floats());
  check_finite(k, n, 65504.0f);
  check_finite(v, n, 65504.0f);
  f32_to_f16_n(k, dst, n);
  f32_to_f16_n(v, dst + 2 * n, n);
}

void f16_decode(const KvShape& s, const uint8_t* src, float* k, float* v) {
  const size_t n = static_cast<size_t>(s.layer_floats());
  f16_to_f32_n(src, k, n);
  f16_to_f32_n(src + 2 * n, v, n);
}

}  // namespace cb::cache::detail
