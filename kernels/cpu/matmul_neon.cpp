// NEON matmul for every weight type: y = x * W^T with f32 activations.
//
//  * GEMM (n_rows > 1): the packed GEMM of gemm_panels.h, as on AVX2.  A
//    block of weight rows is dequantized once per call (by the reference
//    decoder, dequantize_row: its cost is shared by every activation row)
//    into k-major panels of 16 columns; a 6 x 16 micro-kernel keeps 24
//    accumulators of 4 lanes in registers and issues 24 FMAs per k for 4
//    panel loads and 6 broadcasts.
//  * GEMV (n_rows == 1): Q4_0, Q4_1 and Q8_0 blocks are decoded in
//    registers and their scale and offset factored out of the dot product
//    (d * sum(q x) + m * sum(x)), as in the AVX2 GEMV; the other types
//    decode a row through dequantize_row into a per-thread buffer and take
//    a NEON dot product.
// Every output element is computed by the same sequence of operations
// whatever the column split, so results do not depend on the thread count.
#include <cstdint>
#include <cstdlib>
#include <new>

#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/gemm_panels.h"
#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd_neon.h"
#include "platform/half.h"

namespace cb::neon {
namespace {

using tiles::kMR;
using tiles::kNR;

float* aligned_floats(int64_t n) {
  void* p = std::aligned_alloc(64, static_cast<size_t>((n * 4 + 63) / 64 * 64));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<float*>(p);
}

// A per-thread buffer of at least n floats (grown on demand).
float* row_buffer(int64_t n) {
  struct Buffer {
    float* data = nullptr;
    int64_t cap = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer b;
  if (n > b.cap) {
    std::free(b.data);
    b.data = nullptr;
    b.cap = 0;
    b.data = aligned_floats(n);
    b.cap = n;
  }
  return b.data;
}

inline void store_row(float* y, const float32x4_t* a, int64_t ncols, bool first) {
  if (ncols == kNR) {
    for (int j = 0; j < 4; ++j) {
      const float32x4_t v = first ? a[j] : vaddq_f32(vld1q_f32(y + 4 * j), a[j]);
      vst1q_f32(y + 4 * j, v);
    }
    return;
  }
  float sum[kNR];
  for (int j = 0; j < 4; ++j) vst1q_f32(sum + 4 * j, a[j]);
  for (int64_t c = 0; c < ncols; ++c) y[c] = first ? sum[c] : y[c] + sum[c];
}

// y[r][0..ncols) (+)= sum_k x[r][k] * panel[k][0..ncols) for r < MR.
template <int MR>
void micro_kernel(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y,
                  int64_t ldy, int64_t ncols, bool first) {
  float32x4_t acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float* pk = panel + k * kNR;
    const float32x4_t w0 = vld1q_f32(pk), w1 = vld1q_f32(pk + 4);
    const float32x4_t w2 = vld1q_f32(pk + 8), w3 = vld1q_f32(pk + 12);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float32x4_t xb = vld1q_dup_f32(x + r * ldx + k);
      acc[r][0] = vfmaq_f32(acc[r][0], w0, xb);
      acc[r][1] = vfmaq_f32(acc[r][1], w1, xb);
      acc[r][2] = vfmaq_f32(acc[r][2], w2, xb);
      acc[r][3] = vfmaq_f32(acc[r][3], w3, xb);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) store_row(y + r * ldy, acc[r], ncols, first);
}

using MicroKernel = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                             bool);
constexpr MicroKernel kMicroKernels[kMR + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>,
                                                micro_kernel<3>, micro_kernel<4>, micro_kernel<5>,
                                                micro_kernel<6>};

// What tiles::gemm needs of NEON (gemm_panels.h).
struct Isa {
  static constexpr int64_t kLanes = 4;
  static void transpose(const float* src, int64_t lds, float* dst, int64_t ldd) {
    transpose4(src, lds, dst, ldd);
  }
  static void micro_kernel(int mr, const float* x, int64_t ldx, const float* panel, int64_t kc,
                           float* y, int64_t ldy, int64_t ncols, bool first) {
    kMicroKernels[mr](x, ldx, panel, kc, y, ldy, ncols, first);
  }
};

// The weight rows decoded by the reference decoder (dequantize_row): its
// cost is shared by every activation row.
void gemm(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
          int64_t o_end) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const int64_t block = dtype_block_elems(w.type);
  const size_t block_bytes = dtype_block_bytes(w.type);
  tiles::gemm<Isa>(w, x, n_rows, y, o_begin, o_end,
                   [&](int64_t o, int64_t k0, int64_t kc, float* row) {
                     dequantize_row(w.type,
                                    base + static_cast<size_t>(o) * row_bytes +
                                        static_cast<size_t>(k0 / block) * block_bytes,
                                    row, kc);
                   });
}

// ---- GEMV ------------------------------------------------------------------

inline float dot(const float* a, const float* b, int64_t n) {
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  float s = vaddvq_f32(vaddq_f32(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void gemv_dequantized(const WeightView& w, const float* x, float* y, int64_t o_begin,
                      int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  float* row = row_buffer(w.n_in);
  for (int64_t o = o_begin; o < o_end; ++o) {
    dequantize_row(w.type, base + static_cast<size_t>(o) * row_bytes, row, w.n_in);
    y[o] = dot(row, x, w.n_in);
  }
}

// sum(q * x) over a block of 32 as 4 lanes; q as eight vectors of 4.
inline float32x4_t block_qx(const float32x4_t* q, const float* x) {
  float32x4_t t = vmulq_f32(q[0], vld1q_f32(x));
  for (int j = 1; j < 8; ++j) t = vfmaq_f32(t, q[j], vld1q_f32(x + 4 * j));
  return t;
}

// 16 bytes of 4-bit quants as f32: elements 0-15 from the low nibbles,
// 16-31 from the high ones.
inline void nibbles_f32(const uint8_t* qs, float32x4_t* q) {
  const uint8x16_t v = vld1q_u8(qs);
  const uint8x16_t halves[2] = {vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8(v, 4)};
  for (int h = 0; h < 2; ++h) {
    const uint16x8_t a = vmovl_u8(vget_low_u8(halves[h])), b = vmovl_high_u8(halves[h]);
    q[4 * h + 0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(a)));
    q[4 * h + 1] = vcvtq_f32_u32(vmovl_high_u16(a));
    q[4 * h + 2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(b)));
    q[4 * h + 3] = vcvtq_f32_u32(vmovl_high_u16(b));
  }
}

inline void int8_f32(const int8_t* qs, float32x4_t* q) {
  for (int h = 0; h < 2; ++h) {
    const int8x16_t v = vld1q_s8(qs + 16 * h);
    const int16x8_t a = vmovl_s8(vget_low_s8(v)), b = vmovl_high_s8(v);
    q[4 * h + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(a)));
    q[4 * h + 1] = vcvtq_f32_s32(vmovl_high_s16(a));
    q[4 * h + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(b)));
    q[4 * h + 3] = vcvtq_f32_s32(vmovl_high_s16(b));
  }
}

// Q8_0: d * sum(q x); Q4_0: d * sum(q x) - 8 * d * sum(x); Q4_1: d * sum(q x)
// + m * sum(x).  The q are small integers, exact in f32.
template <DType T>
void gemv_blocks(const WeightView& w, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.n_in / kQK;
  float* sx = row_buffer(nb);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    float32x4_t s = vld1q_f32(xb);
    for (int j = 1; j < 8; ++j) s = vaddq_f32(s, vld1q_f32(xb + 4 * j));
    sx[b] = vaddvq_f32(s);
  }
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = base + static_cast<size_t>(o) * row_bytes;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    float off0 = 0.0f, off1 = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
      float32x4_t q[8];
      float d, off;
      if constexpr (T == DType::Q8_0) {
        const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[i];
        int8_f32(b.qs, q);
        d = f16_to_f32(b.d);
        off = 0.0f;
      } else if constexpr (T == DType::Q4_0) {
        const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[i];
        nibbles_f32(b.qs, q);
        d = f16_to_f32(b.d);
        off = -8.0f * d * sx[i];
      } else {
        const BlockQ4_1& b = reinterpret_cast<const BlockQ4_1*>(row)[i];
        nibbles_f32(b.qs, q);
        d = f16_to_f32(b.d);
        off = f16_to_f32(b.m) * sx[i];
      }
      const float32x4_t t = block_qx(q, x + i * kQK);
      if (i & 1) {
        acc1 = vfmaq_n_f32(acc1, t, d);
        off1 += off;
      } else {
        acc0 = vfmaq_n_f32(acc0, t, d);
        off0 += off;
      }
    }
    y[o] = vaddvq_f32(vaddq_f32(acc0, acc1)) + (off0 + off1);
  }
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end) {
  if (n_rows <= 0 || o_begin >= o_end) return;
  if (n_rows > 1) return gemm(w, x, n_rows, y, o_begin, o_end);
  switch (w.type) {
    case DType::Q4_0:
      return gemv_blocks<DType::Q4_0>(w, x, y, o_begin, o_end);
    case DType::Q4_1:
      return gemv_blocks<DType::Q4_1>(w, x, y, o_begin, o_end);
    case DType::Q8_0:
      return gemv_blocks<DType::Q8_0>(w, x, y, o_begin, o_end);
    default:
      return gemv_dequantized(w, x, y, o_begin, o_end);
  }
}

}  // namespace cb::neon
