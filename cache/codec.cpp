#include "cache/codec.h"

#include <zstd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "cache/codec_impl.h"
#include "platform/error.h"
#include "platform/half.h"

namespace cb::cache {
namespace detail {

uint16_t f16_round_up(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) < x) {
    // x >= 0 here, so the next larger f16 is the next bit pattern (0x8000 is -0).
    h = (h == 0x8000u) ? uint16_t{1} : static_cast<uint16_t>(h + 1);
  }
  return h;
}

uint16_t f16_round_down(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) > x) {
    // Step toward -inf: a positive pattern decreases, a negative one grows in
    // magnitude; +0 steps to the smallest negative subnormal.
    if (h == 0) {
      h = 0x8001u;
    } else if (h & 0x8000u) {
      h = static_cast<uint16_t>(h + 1);
    } else {
      h = static_cast<uint16_t>(h - 1);
    }
  }
  return h;
}

void check_finite(const float* x, size_t n, float limit) {
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(x[i]) <= limit)) {  // also catches NaN
      fail(ErrorCode::kInvalidArgument, "chunk KV value " + std::to_string(x[i]) +
                                            " is not finite or exceeds the codec range " +
                                            std::to_string(limit));
    }
  }
}

}  // namespace detail

namespace {

constexpr uint8_t kRaw = 0;
constexpr uint8_t kZstd = 1;

size_t payload_bytes(Codec codec, const KvShape& s) {
  switch (codec) {
    case Codec::kF16:
      return detail::f16_payload_bytes(s);
    case Codec::kQ8:
      return detail::q8_payload_bytes(s);
    case Codec::kQ4:
      return detail::q4_payload_bytes(s);
  }
  fail(ErrorCode::kInvalidArgument, "unknown codec " + std::to_string(static_cast<int>(codec)));
}

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// One context per thread: creating a zstd context per layer costs more than
// decoding a small segment.
ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> ctx(ZSTD_createCCtx());
  if (!ctx) fail(ErrorCode::kOutOfMemory, "ZSTD_createCCtx");
  return ctx.get();
}

ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> ctx(ZSTD_createDCtx());
  if (!ctx) fail(ErrorCode::kOutOfMemory, "ZSTD_createDCtx");
  return ctx.get();
}

}  // namespace

void encode_layer(Codec codec, const KvShape& s, const float* k, const float* v, int zstd_level,
                  std::vector<uint8_t>& out) {
  const size_t n = payload_bytes(codec, s);
  if (n > UINT32_MAX) fail(ErrorCode::kInvalidArgument, "chunk layer too large for one segment");
  thread_local std::vector<uint8_t> payload;
  payload.resize(n);
  switch (codec) {
    case Codec::kF16:
      detail::f16_encode(s, k, v, payload.data());
      break;
    case Codec::kQ8:
      detail::q8_encode(s, k, v, payload.data());
      break;
    case Codec::kQ4:
      detail::q4_encode(s, k, v, payload.data());
      break;
  }

  const size_t base = out.size();
  uint8_t header[kSegmentHeaderBytes] = {kRaw, static_cast<uint8_t>(codec), 0, 0};
  const uint32_t n32 = static_cast<uint32_t>(n);
  std::memcpy(header + 4, &n32, 4);
  // f16 stays raw: zstd saves only a few percent on half floats (their
  // mantissas are noise) and would cost most of the decode time.
  if (zstd_level > 0 && codec != Codec::kF16) {
    out.resize(base + kSegmentHeaderBytes + ZSTD_compressBound(n));
    const size_t z =
        ZSTD_compressCCtx(thread_cctx(), out.data() + base + kSegmentHeaderBytes,
                          out.size() - base - kSegmentHeaderBytes, payload.data(), n, zstd_level);
    if (ZSTD_isError(z)) fail(ErrorCode::kInternal, std::string("zstd: ") + ZSTD_getErrorName(z));
    // Keep zstd only when it pays for its decode time (saves >= 1/32).
    if (z + z / 32 < n) {
      header[0] = kZstd;
      std::memcpy(out.data() + base, header, kSegmentHeaderBytes);
      out.resize(base + kSegmentHeaderBytes + z);
      return;
    }
  }
  out.resize(base + kSegmentHeaderBytes + n);
  std::memcpy(out.data() + base, header, kSegmentHeaderBytes);
  std::memcpy(out.data() + base + kSegmentHeaderBytes, payload.data(), n);
}

void decode_layer(Codec codec, const KvShape& s, const uint8_t* seg, size_t n, float* k_out,
                  float* v_out) {
  if (n < kSegmentHeaderBytes) fail(ErrorCode::kFormat, "cache segment shorter than its header");
  uint32_t raw_n;
  std::memcpy(&raw_n, seg + 4, 4);
  const size_t expect = payload_bytes(codec, s);
  if (seg[1] != static_cast<uint8_t>(codec) || seg[2] != 0 || seg[3] != 0 || raw_n != expect) {
    fail(ErrorCode::kFormat, "cache segment header does not match its codec or shape");
  }
  const uint8_t* body = seg + kSegmentHeaderBytes;
  const size_t body_n = n - kSegmentHeaderBytes;
  const uint8_t* payload = nullptr;
  thread_local std::vector<uint8_t> scratch;
  if (seg[0] == kRaw) {
    if (body_n != expect) fail(ErrorCode::kFormat, "cache segment has the wrong size");
    payload = body;
  } else if (seg[0] == kZstd) {
    scratch.resize(expect);
    const size_t got = ZSTD_decompressDCtx(thread_dctx(), scratch.data(), expect, body, body_n);
    if (ZSTD_isError(got) || got != expect) {
      fail(ErrorCode::kFormat, "cache segment does not decompress to its recorded size");
    }
    payload = scratch.data();
  } else {
    fail(ErrorCode::kFormat, "cache segment has an unknown container type");
  }
  switch (codec) {
    case Codec::kF16:
      return detail::f16_decode(s, payload, k_out, v_out);
    case Codec::kQ8:
      return detail::q8_decode(s, payload, k_out, v_out);
    case Codec::kQ4:
      return detail::q4_decode(s, payload, k_out, v_out);
  }
}

}  // namespace cb::cache
