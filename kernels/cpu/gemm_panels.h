// The packed GEMM (prefill's matmul, n_rows > 1) that the AVX2 and NEON
// kernels share: a cache-blocked, register-tiled GEMM in the classic form.
// The weight block of nc output columns x kc elements is decoded once per
// call into f32 "panels" of kNR = 16 columns laid out k-major
// (panel[k][0..15]), sized to stay in L2 (kPackFloats * 4 = 256 KiB).  A
// kMR x 16 micro-kernel then keeps a 6 x 16 block of y in registers: per k
// it loads the panel's 16 floats once, broadcasts one activation per row and
// issues the FMAs, so the FMA units, not the loads, set the pace.  The
// kMR x kc activation slice is reused from L1 across every panel of the
// block.
//
// Every y[r][o] is the same FMA chain over k (in order within a k-block, the
// k-blocks added in order) whatever its row block, panel or lane, and the
// k-blocking depends on n_in and the type only, so the result does not
// depend on how the columns are split over threads.
//
// What differs by instruction set comes in a traits type `Isa`, defined by
// each kernel file in an anonymous namespace, so that every instantiation
// here has internal linkage and that file's flags (the linkage rule in
// ops_avx2.h):
//   kLanes                  floats per vector
//   transpose(src, lds, dst, ldd)  a kLanes x kLanes block of floats, transposed
//   micro_kernel(mr, x, ldx, panel, kc, y, ldy, ncols, first)
//                           y[r][0..ncols) (+)= sum_k x[r][k] panel[k][..] for
//                           r < mr <= kMR (stores when first, else adds)
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

#include "kernels/backend.h"

namespace cb::tiles {

constexpr int64_t kNR = 16;
constexpr int64_t kMR = 6;
constexpr int64_t kMaxKC = 768;
constexpr int64_t kPackFloats = 64 * 1024;  // 256 KiB of packed panels
constexpr int64_t kRowBufFloats = kNR * kMaxKC;

// Per-thread packing buffers: the panels and kNR decoded weight rows.
// malloc'd, no std containers (the linkage rule).
template <class Isa>
struct PackBuffers {
  float* panels = nullptr;
  float* rows = nullptr;
  PackBuffers() {
    panels = static_cast<float*>(std::aligned_alloc(64, kPackFloats * sizeof(float)));
    rows = static_cast<float*>(std::aligned_alloc(64, kRowBufFloats * sizeof(float)));
    if (panels == nullptr || rows == nullptr) {
      std::free(panels);
      std::free(rows);
      throw std::bad_alloc();
    }
  }
  ~PackBuffers() {
    std::free(panels);
    std::free(rows);
  }
  PackBuffers(const PackBuffers&) = delete;
  PackBuffers& operator=(const PackBuffers&) = delete;
};

template <class Isa>
PackBuffers<Isa>& pack_buffers() {
  thread_local PackBuffers<Isa> buffers;
  return buffers;
}

// The k-block length: n_in split into equal parts of at most kMaxKC,
// rounded up to the type's block size (quantized decoders work on whole
// blocks).  Depends on n_in and the type only.
template <class Isa>
int64_t k_block(int64_t n_in, int64_t block) {
  const int64_t parts = (n_in + kMaxKC - 1) / kMaxKC;
  const int64_t kc = (n_in + parts - 1) / parts;
  return (kc + block - 1) / block * block;
}

// Packs weight rows [o0, o0 + nc) x elements [k0, k0 + kc) into panels of
// kNR columns: panel p holds element k of column p * kNR + c at
// panels[p * kNR * kc + k * kNR + c].  Columns past nc are zero.
// decode_row(o, k0, kc, row) writes elements [k0, k0 + kc) of weight row o
// as floats.
template <class Isa, class DecodeRow>
void pack_panels(const DecodeRow& decode_row, int64_t o0, int64_t nc, int64_t k0, int64_t kc,
                 float* panels, float* rows) {
  constexpr int64_t w = Isa::kLanes;
  for (int64_t p0 = 0; p0 < nc; p0 += kNR) {
    const int64_t np = nc - p0 < kNR ? nc - p0 : kNR;
    for (int64_t c = 0; c < kNR; ++c) {
      float* row = rows + c * kc;
      if (c < np) {
        decode_row(o0 + p0 + c, k0, kc, row);
      } else {
        for (int64_t k = 0; k < kc; ++k) row[k] = 0.0f;
      }
    }
    float* panel = panels + p0 * kc;
    int64_t k = 0;
    for (; k + w <= kc; k += w) {
      for (int64_t c = 0; c < kNR; c += w)
        Isa::transpose(rows + c * kc + k, kc, panel + k * kNR + c, kNR);
    }
    for (; k < kc; ++k) {  // tail of an f32/f16/bf16 row
      for (int64_t c = 0; c < kNR; ++c) panel[k * kNR + c] = rows[c * kc + k];
    }
  }
}

// y[r][o] = sum_k x[r][k] * W[o][k] for r < n_rows, o in [o_begin, o_end)
// (x is n_rows x w.n_in, y is n_rows x w.n_out), W's rows from decode_row
// as in pack_panels.
template <class Isa, class DecodeRow>
void gemm(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
          int64_t o_end, const DecodeRow& decode_row) {
  PackBuffers<Isa>& buf = pack_buffers<Isa>();
  const int64_t kc_max = k_block<Isa>(w.n_in, dtype_block_elems(w.type));
  const int64_t nc_max = kPackFloats / kc_max / kNR * kNR;
  for (int64_t o0 = o_begin; o0 < o_end; o0 += nc_max) {
    const int64_t nc = o_end - o0 < nc_max ? o_end - o0 : nc_max;
    for (int64_t k0 = 0; k0 < w.n_in; k0 += kc_max) {
      const int64_t kc = w.n_in - k0 < kc_max ? w.n_in - k0 : kc_max;
      pack_panels<Isa>(decode_row, o0, nc, k0, kc, buf.panels, buf.rows);
      const bool first = k0 == 0;
      for (int64_t r0 = 0; r0 < n_rows; r0 += kMR) {
        const int mr = static_cast<int>(n_rows - r0 < kMR ? n_rows - r0 : kMR);
        const float* xr = x + r0 * w.n_in + k0;
        float* yr = y + r0 * w.n_out + o0;
        for (int64_t p0 = 0; p0 < nc; p0 += kNR) {
          Isa::micro_kernel(mr, xr, w.n_in, buf.panels + p0 * kc, kc, yr + p0, w.n_out,
                            nc - p0 < kNR ? nc - p0 : kNR, first);
        }
      }
    }
  }
}

}  // namespace cb::tiles
