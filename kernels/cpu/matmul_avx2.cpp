// AVX2 matmul for every weight type: y = x * W^T with f32 activations.
//
// Each weight type has a row decoder that turns a range of a weight row into
// f32 vectors, 32 elements at a time, and hands them to a sink:
//  * GEMV (decode, n_rows == 1): the sink multiplies the decoded vectors into
//    the activation row at once, so the weight is read exactly once and never
//    stored (fused dequantize+dot).
//  * GEMM (prefill, n_rows > 1): the sink stores a tile of kTileRows weight
//    rows x kTileK elements into a per-thread f32 buffer, which a 3x4
//    register-blocked micro-kernel then multiplies by every activation row,
//    so each weight block is dequantized once per call, not once per row.
// Work is split by the caller over output columns, and every output element
// is computed by the same sequence of operations whatever the split, so the
// result does not depend on the thread count.
#include <cstdint>
#include <cstdlib>
#include <new>

#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_avx2.h"

namespace cb::avx2 {
namespace {

// 32 weight rows x 256 elements = 32 KiB of f32: stays in L1/L2 while all
// activation rows stream past it.  256 is a multiple of every block size.
constexpr int64_t kTileRows = 32;
constexpr int64_t kTileK = 256;

inline __m256 i8_to_ps(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}
inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}

// Decoders.  decode(row, k0, k1, sink) calls sink.vec(k, w0, w1, w2, w3) with
// the weights of elements k..k+31 for each 32-element run in [k0, k1), and
// sink.one(k, w) for a tail shorter than 32 (float types only; quantized rows
// are whole blocks).  k0 and k1 are multiples of the block size.

struct DecodeF32 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const float* p = static_cast<const float*>(row);
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) {
      s.vec(k, _mm256_loadu_ps(p + k), _mm256_loadu_ps(p + k + 8), _mm256_loadu_ps(p + k + 16),
            _mm256_loadu_ps(p + k + 24));
    }
    for (; k < k1; ++k) s.one(k, p[k]);
  }
};

struct DecodeF16 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const uint16_t* p = static_cast<const uint16_t*>(row);
    auto ld = [p](int64_t k) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k)));
    };
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) s.vec(k, ld(k), ld(k + 8), ld(k + 16), ld(k + 24));
    for (; k < k1; ++k) s.one(k, half(p[k]));
  }
};

struct DecodeBF16 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const uint16_t* p = static_cast<const uint16_t*>(row);
    // bf16 is the top half of an f32: widen to 32 bits and shift.
    auto ld = [p](int64_t k) {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    };
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) s.vec(k, ld(k), ld(k + 8), ld(k + 16), ld(k + 24));
    for (; k < k1; ++k) {
      const __m128i w = _mm_cvtsi32_si128(static_cast<int>(static_cast<uint32_t>(p[k]) << 16));
      s.one(k, _mm_cvtss_f32(_mm_castsi128_ps(w)));
    }
  }
};

// The 32 4-bit quants of 16 bytes as f32: byte j holds element j (low
// nibble) and element j + 16 (high nibble).  Widening the bytes to 32-bit
// lanes first lets one mask and one shift split the nibbles, with two
// byte-widening shuffles per 32 elements instead of four.
struct Nibbles {
  __m256 lo0, lo1, hi0, hi1;  // elements 0-7, 8-15, 16-23, 24-31
};
inline Nibbles nibbles16(const uint8_t* qs) {
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i b1 =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i m4 = _mm256_set1_epi32(0x0F);
  return {
      _mm256_cvtepi32_ps(_mm256_and_si256(b0, m4)), _mm256_cvtepi32_ps(_mm256_and_si256(b1, m4)),
      _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4))};
}

struct DecodeQ4_0 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ4_0* b = static_cast<const BlockQ4_0*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const Nibbles q = nibbles16(b->qs);
      // (q - 8) * d as one fma: q * d + (-8 d), with -8 d exact.
      const float d = half(b->d);
      const __m256 vd = _mm256_set1_ps(d), vo = _mm256_set1_ps(-8.0f * d);
      s.vec(k, _mm256_fmadd_ps(q.lo0, vd, vo), _mm256_fmadd_ps(q.lo1, vd, vo),
            _mm256_fmadd_ps(q.hi0, vd, vo), _mm256_fmadd_ps(q.hi1, vd, vo));
    }
  }
};

struct DecodeQ4_1 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const Nibbles q = nibbles16(b->qs);
      const __m256 vd = _mm256_set1_ps(half(b->d)), vm = _mm256_set1_ps(half(b->m));
      s.vec(k, _mm256_fmadd_ps(q.lo0, vd, vm), _mm256_fmadd_ps(q.lo1, vd, vm),
            _mm256_fmadd_ps(q.hi0, vd, vm), _mm256_fmadd_ps(q.hi1, vd, vm));
    }
  }
};

struct DecodeQ8_0 {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row) + k0 / kQK;
    for (int64_t k = k0; k < k1; k += kQK, ++b) {
      const __m256 vd = _mm256_set1_ps(half(b->d));
      auto ld = [b](int j) {
        return i8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + j)));
      };
      s.vec(k, _mm256_mul_ps(ld(0), vd), _mm256_mul_ps(ld(8), vd), _mm256_mul_ps(ld(16), vd),
            _mm256_mul_ps(ld(24), vd));
    }
  }
};

struct DecodeQ4_K {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ4_K* b = static_cast<const BlockQ4_K*>(row) + k0 / kQKK;
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d), dmin = half(b->dmin);
      for (int c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c low, 2c + 1 high nibbles
        __m256 lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {  // widened as in nibbles16
          const __m256i w = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + 32 * c + 8 * j)));
          lo[j] = _mm256_cvtepi32_ps(_mm256_and_si256(w, m4));
          hi[j] = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
        }
        uint8_t sc, m;
        q4k_scale_min(b->scales, 2 * c, &sc, &m);
        __m256 vd = _mm256_set1_ps(d * sc), vm = _mm256_set1_ps(dmin * m);
        s.vec(k + 64 * c, _mm256_fmsub_ps(lo[0], vd, vm), _mm256_fmsub_ps(lo[1], vd, vm),
              _mm256_fmsub_ps(lo[2], vd, vm), _mm256_fmsub_ps(lo[3], vd, vm));
        q4k_scale_min(b->scales, 2 * c + 1, &sc, &m);
        vd = _mm256_set1_ps(d * sc);
        vm = _mm256_set1_ps(dmin * m);
        s.vec(k + 64 * c + 32, _mm256_fmsub_ps(hi[0], vd, vm), _mm256_fmsub_ps(hi[1], vd, vm),
              _mm256_fmsub_ps(hi[2], vd, vm), _mm256_fmsub_ps(hi[3], vd, vm));
      }
    }
  }
};

struct DecodeQ6_K {
  template <class Sink>
  static void decode(const void* row, int64_t k0, int64_t k1, Sink& s) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(row) + k0 / kQKK;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = half(b->d);
      for (int half_i = 0; half_i < 2; ++half_i) {
        const uint8_t* ql = b->ql + 64 * half_i;
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * half_i));
        // The four runs of 32 elements (see BlockQ6_K); the 2 high bits are
        // moved to bits 4-5 with shifts that never carry across bytes
        // because the masked bits cannot reach a neighbour.
        const __m256i runs[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4)),
            _mm256_or_si256(_mm256_and_si256(l1, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                            _mm256_and_si256(qh, _mm256_set1_epi8(0x30))),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))),
                                  2)),
        };
        const int8_t* sc = b->scales + 8 * half_i;
        for (int r = 0; r < 4; ++r) {
          const __m256i q = _mm256_sub_epi8(runs[r], _mm256_set1_epi8(32));  // now signed
          const __m128i qa = _mm256_castsi256_si128(q), qb = _mm256_extracti128_si256(q, 1);
          // Elements 0-15 of the run use scale 2r, 16-31 scale 2r + 1; the
          // product d * sc is rounded first, as in the reference.
          const __m256 da = _mm256_set1_ps(d * static_cast<float>(sc[2 * r]));
          const __m256 db = _mm256_set1_ps(d * static_cast<float>(sc[2 * r + 1]));
          s.vec(k + 128 * half_i + 32 * r, _mm256_mul_ps(i8_to_ps(qa), da),
                _mm256_mul_ps(i8_to_ps(_mm_srli_si128(qa, 8)), da), _mm256_mul_ps(i8_to_ps(qb), db),
                _mm256_mul_ps(i8_to_ps(_mm_srli_si128(qb, 8)), db));
        }
      }
    }
  }
};

// GEMV sink: accumulates w . x into four independent accumulators (hides the
// FMA latency).
struct DotSink {
  const float* x;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  float tail = 0.0f;

  void vec(int64_t k, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), acc[0]);
    acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), acc[1]);
    acc[2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + k + 16), acc[2]);
    acc[3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + k + 24), acc[3]);
  }
  void one(int64_t k, float w) { tail += w * x[k]; }
  float total() const {
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) + tail;
  }
};

// Tile sink: stores decoded weights of elements [k0, ..) at dst[k - k0].
struct StoreSink {
  float* dst;
  int64_t k0;
  void vec(int64_t k, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    float* p = dst + (k - k0);
    _mm256_storeu_ps(p, w0);
    _mm256_storeu_ps(p + 8, w1);
    _mm256_storeu_ps(p + 16, w2);
    _mm256_storeu_ps(p + 24, w3);
  }
  void one(int64_t k, float w) { dst[k - k0] = w; }
};

// Per-thread tile buffer.  Internal linkage and no std containers: see the
// linkage rule in ops_avx2.h.
struct TileBuffer {
  float* data = nullptr;
  TileBuffer() {
    data = static_cast<float*>(std::aligned_alloc(64, kTileRows * kTileK * sizeof(float)));
    if (data == nullptr) throw std::bad_alloc();
  }
  ~TileBuffer() { std::free(data); }
};

float* tile_buffer() {
  thread_local TileBuffer buffer;
  return buffer.data;
}

// y[r][c] (+)= sum_k x[r][k] * W[c][k] for R rows and 4 tile rows (columns
// of y); ncols <= 4 of them are written.  W rows are kTileK apart.
template <int R>
void micro_kernel(const float* w, const float* x, int64_t ldx, int64_t kc, float* y, int64_t ldy,
                  int64_t ncols, bool first) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * ldx + k);
    for (int c = 0; c < 4; ++c) {
      const __m256 wv = _mm256_loadu_ps(w + c * kTileK + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv, xv[r], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(16) float sum[4];
    _mm_store_ps(sum, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    for (int64_t kt = k; kt < kc; ++kt) {  // tail of an f32/f16/bf16 row
      for (int c = 0; c < 4; ++c) sum[c] += w[c * kTileK + kt] * x[r * ldx + kt];
    }
    float* yr = y + r * ldy;
    for (int64_t c = 0; c < ncols; ++c) yr[c] = first ? sum[c] : yr[c] + sum[c];
  }
}

template <class Decoder>
void gemv(const WeightView& w, const float* x, float* y, int64_t o_begin, int64_t o_end,
          size_t row_bytes) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = o_begin; o < o_end; ++o) {
    DotSink sink{x};
    Decoder::decode(base + static_cast<size_t>(o) * row_bytes, 0, w.n_in, sink);
    y[o] = sink.total();
  }
}

template <class Decoder>
void gemm(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
          int64_t o_end, size_t row_bytes) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  float* tile = tile_buffer();
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kTileRows) {
    const int64_t nt = o_end - o0 < kTileRows ? o_end - o0 : kTileRows;
    const int64_t nt_padded = (nt + 3) / 4 * 4;
    for (int64_t k0 = 0; k0 < w.n_in; k0 += kTileK) {
      const int64_t kc = w.n_in - k0 < kTileK ? w.n_in - k0 : kTileK;
      for (int64_t t = 0; t < nt; ++t) {
        StoreSink sink{tile + t * kTileK, k0};
        Decoder::decode(base + static_cast<size_t>(o0 + t) * row_bytes, k0, k0 + kc, sink);
      }
      // Padding rows give the micro-kernel whole groups of 4; their sums
      // are never stored.
      for (int64_t t = nt; t < nt_padded; ++t) {
        for (int64_t k = 0; k < kc; ++k) tile[t * kTileK + k] = 0.0f;
      }
      const bool first = k0 == 0;
      int64_t r = 0;
      for (; r + 3 <= n_rows; r += 3) {
        for (int64_t t = 0; t < nt; t += 4) {
          micro_kernel<3>(tile + t * kTileK, x + r * w.n_in + k0, w.n_in, kc,
                          y + r * w.n_out + o0 + t, w.n_out, nt - t < 4 ? nt - t : 4, first);
        }
      }
      for (; r < n_rows; ++r) {
        for (int64_t t = 0; t < nt; t += 4) {
          micro_kernel<1>(tile + t * kTileK, x + r * w.n_in + k0, w.n_in, kc,
                          y + r * w.n_out + o0 + t, w.n_out, nt - t < 4 ? nt - t : 4, first);
        }
      }
    }
  }
}

template <class Decoder>
void matmul_typed(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
                  int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  if (n_rows == 1) {
    gemv<Decoder>(w, x, y, o_begin, o_end, row_bytes);
  } else {
    gemm<Decoder>(w, x, n_rows, y, o_begin, o_end, row_bytes);
  }
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end) {
  if (n_rows <= 0 || o_begin >= o_end) return;
  switch (w.type) {
    case DType::F32:
      return matmul_typed<DecodeF32>(w, x, n_rows, y, o_begin, o_end);
    case DType::F16:
      return matmul_typed<DecodeF16>(w, x, n_rows, y, o_begin, o_end);
    case DType::BF16:
      return matmul_typed<DecodeBF16>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_0:
      return matmul_typed<DecodeQ4_0>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_1:
      return matmul_typed<DecodeQ4_1>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q8_0:
      return matmul_typed<DecodeQ8_0>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q4_K:
      return matmul_typed<DecodeQ4_K>(w, x, n_rows, y, o_begin, o_end);
    case DType::Q6_K:
      return matmul_typed<DecodeQ6_K>(w, x, n_rows, y, o_begin, o_end);
  }
}

}  // namespace cb::avx2
