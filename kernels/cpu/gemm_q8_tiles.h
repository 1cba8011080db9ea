// The int8 GEMM of prefill (Backend::matmul_q8 with many rows) as far as
// the instruction sets share it: y = x * W^T with the activation rows
// quantized to int8 blocks of 32 (Q8Row) and the weights' integer quants
// multiplied by them.  gemm_q8_avx512.cpp (VPDPBUSD), gemm_q8_avx2.cpp
// (VPMADDUBSW) and gemm_q8_dotprod.cpp (SDOT) add only their micro-kernels
// and their way of handling 32 quant bytes.
//
// Every weight type is read as unsigned 8-bit quants q with, per group of G
// elements (32, or 16 for the types with a scale per run of 16), a scale
// and an offset: w = scale * q + off.  Signed quants are shifted to
// unsigned (Q8_0 and IQ4 by +128, Q6_K's q - 32 and Q3_K's q - 4 are kept
// as q) and the shift moves into the offset.  With the activation
// x = dx * qx per block of 32 (sum sx = dx * sum(qx) over the group), a
// group adds
//     (scale * dx) * sum(q * qx)  +  off * sx
// to its output: the sum exact in int32, the rest f32.  Same values as the
// weights' dequantization (w = (d * sc) * q - dmin * m for Q4_K, etc.), so
// the only differences from the exact f32 GEMM are the activations' int8
// rounding and f32 summation order.
//
// Structure as the f32 GEMM (gemm_panels.h): a block of up to kPackBytes of
// weight rows is decoded once per call into panels of 16 columns, laid out
// for 4-byte dot products: per group, per 4 consecutive elements, the 16
// columns' 4 quant bytes (64 bytes), then the group's 16 scales and 16
// offsets.  A micro-kernel keeps a block of outputs in registers (an int32
// sum per group, an f32 accumulator) and multiplies 4 activation bytes of a
// row per step.  Every output is the same chain of operations (groups in
// order within a k-block, k-blocks in order, each group's int32 sum exact,
// then (scale * dx) rounded, and two fused multiply-adds) whatever the
// split over threads or the instruction set, so the result depends on
// neither.
//
// What differs by instruction set comes in a traits type `Isa`: kMR rows
// and kNP panels (1 or 2) per micro-kernel call, supports<Decoder>,
// kernel<MR, NP, Decoder>, the MicroKernel for MR rows and NP panels, and
// Quants, the type the decoders and the packing handle 32 quant bytes with
// (its Bytes, and static load, nibbles, q5_quants, iq4_levels,
// q23_k_quants, q45_k_quants, q6_k_runs, flip_sign, plus, store, half and
// transpose16x8, as the x86 one in simd_avx2.h; an instruction set provides
// what the decoders of its supported types use).  Everything here is in an
// anonymous namespace: each kernel file gets its own copy, compiled with
// its flags (the linkage rule in ops_avx2.h).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/dtype.h"

namespace cb::int8_tiles {
namespace {

// ---- Decoders: 32 elements at a time as unsigned quants + scale, offset ----
//
// decode(row, k0, k1, sink) calls sink.put(k, q, scale_a, off_a, scale_b,
// off_b) for each run of 32 elements from k in [k0, k1): q their unsigned
// quants in element order, (scale_a, off_a) for elements 0-15 and
// (scale_b, off_b) for 16-31 (equal for the types with one scale per 32).
// kGroup is the type's group length (32 or 16), kMaxQuant the largest
// quant it puts (what an instruction set that sums products in 16 bits
// must bound).

// 32-element block types: a per-block scale d and offset.
template <class Q, class Block, class Quants, class Offset>
void decode_blocks(const void* row, int64_t k0, int64_t k1, auto& s, Quants quants, Offset offset) {
  const Block* b = static_cast<const Block*>(row) + k0 / kQK;
  for (int64_t k = k0; k < k1; k += kQK, ++b) {
    const float d = Q::half(b->d), off = offset(*b, d);
    s.put(k, quants(*b), d, off, d, off);
  }
}

template <class Q>
struct Int8Q8_0 {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 255;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockQ8_0>(
        row, k0, k1, s, [](const BlockQ8_0& b) { return Q::flip_sign(Q::load(b.qs)); },
        [](const BlockQ8_0&, float d) { return -128.0f * d; });
  }
};
template <class Q>
struct Int8Q4_0 {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 15;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockQ4_0>(
        row, k0, k1, s, [](const BlockQ4_0& b) { return Q::nibbles(b.qs); },
        [](const BlockQ4_0&, float d) { return -8.0f * d; });
  }
};
template <class Q>
struct Int8Q4_1 {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 15;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockQ4_1>(
        row, k0, k1, s, [](const BlockQ4_1& b) { return Q::nibbles(b.qs); },
        [](const BlockQ4_1& b, float) { return Q::half(b.m); });
  }
};
template <class Q>
struct Int8Q5_0 {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 31;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockQ5_0>(
        row, k0, k1, s, [](const BlockQ5_0& b) { return Q::q5_quants(b.qs, b.qh); },
        [](const BlockQ5_0&, float d) { return -16.0f * d; });
  }
};
template <class Q>
struct Int8Q5_1 {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 31;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockQ5_1>(
        row, k0, k1, s, [](const BlockQ5_1& b) { return Q::q5_quants(b.qs, b.qh); },
        [](const BlockQ5_1& b, float) { return Q::half(b.m); });
  }
};
template <class Q>
struct Int8IQ4_NL {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 255;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    decode_blocks<Q, BlockIQ4_NL>(
        row, k0, k1, s, [](const BlockIQ4_NL& b) { return Q::flip_sign(Q::iq4_levels(b.qs)); },
        [](const BlockIQ4_NL&, float d) { return -128.0f * d; });
  }
};

template <class Q>
struct Int8IQ4_XS {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = 255;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = Q::half(b->d);
      for (int j = 0; j < kQKK / kQK; ++j) {
        const float sc = d * static_cast<float>(iq4xs_scale(*b, j) - 32);
        s.put(k + kQK * j, Q::flip_sign(Q::iq4_levels(b->qs + 16 * j)), sc, -128.0f * sc, sc,
              -128.0f * sc);
      }
    }
  }
};

template <class Q, class Block>
struct Int8Q45_K {
  static constexpr int kGroup = 32;
  static constexpr int kMaxQuant = std::is_same_v<Block, BlockQ5_K> ? 31 : 15;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    const Block* b = static_cast<const Block*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = Q::half(b->d), dmin = Q::half(b->dmin);
      const uint8_t* qh = nullptr;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) qh = b->qh;
      uint64_t sc8, m8;
      q4k_scales_mins(b->scales, &sc8, &m8);
      for (int j = 0; j < 8; ++j) {
        const float scale = d * static_cast<float>((sc8 >> (8 * j)) & 0xFF);
        const float off = -(dmin * static_cast<float>((m8 >> (8 * j)) & 0xFF));
        s.put(k + kQK * j, Q::q45_k_quants(b->qs, qh, j), scale, off, scale, off);
      }
    }
  }
};

template <class Q>
struct Int8Q6_K {
  static constexpr int kGroup = 16;
  static constexpr int kMaxQuant = 63;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = Q::half(b->d);
      for (int h = 0; h < 2; ++h) {
        typename Q::Bytes runs[4];
        Q::q6_k_runs(b->ql + 64 * h, b->qh + 32 * h, runs);
        for (int r = 0; r < 4; ++r) {
          const float sa = d * static_cast<float>(b->scales[8 * h + 2 * r]);
          const float sb = d * static_cast<float>(b->scales[8 * h + 2 * r + 1]);
          s.put(k + 128 * h + 32 * r, runs[r], sa, -32.0f * sa, sb, -32.0f * sb);
        }
      }
    }
  }
};

template <class Q, class Block>
struct Int8Q23_K {
  static constexpr int kGroup = 16;
  static constexpr int kMaxQuant = std::is_same_v<Block, BlockQ3_K> ? 7 : 3;
  static void decode(const void* row, int64_t k0, int64_t k1, auto& s) {
    constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
    const Block* b = static_cast<const Block*>(row) + k0 / kQKK;
    for (int64_t k = k0; k < k1; k += kQKK, ++b) {
      const float d = Q::half(b->d);
      for (int j = 0; j < 8; ++j) {
        float scale[2], off[2];
        typename Q::Bytes q;
        if constexpr (kQ3) {
          // q - 4 * !bit in [-4, 3], stored as that + 4.
          q = Q::plus(Q::q23_k_quants(b->qs, b->hmask, j), 4);
          for (int h = 0; h < 2; ++h) {
            scale[h] = d * static_cast<float>(q3k_scale(b->scales, 2 * j + h) - 32);
            off[h] = -4.0f * scale[h];
          }
        } else {
          q = Q::q23_k_quants(b->qs, nullptr, j);
          const float dmin = Q::half(b->dmin);
          for (int h = 0; h < 2; ++h) {
            const uint8_t sc = b->scales[2 * j + h];
            scale[h] = d * static_cast<float>(sc & 0x0F);
            off[h] = -(dmin * static_cast<float>(sc >> 4));
          }
        }
        s.put(k + kQK * j, q, scale[0], off[0], scale[1], off[1]);
      }
    }
  }
};

// ---- Packing ----

constexpr int64_t kNR = 16;                       // columns per panel
constexpr int64_t kMaxKC = 2048;                  // k-block length limit
constexpr size_t kPackBytes = size_t{512} << 10;  // panels of one call, in L2

// A panel holds 32 elements of its 16 columns per chunk: 8 steps of 16 x 4
// quant bytes, then per group of G in the chunk (one, or two for G = 16)
// 16 f32 scales and 16 f32 offsets.
constexpr size_t chunk_bytes(int g) {
  return 8 * 64 + static_cast<size_t>(32 / g) * 2 * 64;
}

// Decoded columns of one panel before the transpose: column c's quants of
// the k-block, and a scale and offset per group of G.
template <class Q, int G>
struct ColumnSink {
  uint8_t* q;  // kc bytes
  float* scale;
  float* off;
  int64_t k0;
  void put(int64_t k, typename Q::Bytes quants, float sa, float oa, float sb, float ob) {
    Q::store(q + (k - k0), quants);
    const int64_t g = (k - k0) / G;
    scale[g] = sa;
    off[g] = oa;
    if constexpr (G == 16) {
      scale[g + 1] = sb;
      off[g + 1] = ob;
    }
  }
};

struct PackBuffers {
  uint8_t* panels = nullptr;
  uint8_t* columns = nullptr;  // kNR x kMaxKC quants
  float* scales = nullptr;     // kNR x (kMaxKC / 16) scales, then as many offsets
  PackBuffers() {
    panels = static_cast<uint8_t*>(std::aligned_alloc(64, kPackBytes));
    columns = static_cast<uint8_t*>(std::aligned_alloc(64, kNR * kMaxKC));
    scales = static_cast<float*>(std::aligned_alloc(64, 2 * kNR * (kMaxKC / 16) * sizeof(float)));
    if (panels == nullptr || columns == nullptr || scales == nullptr) {
      std::free(panels);
      std::free(columns);
      std::free(scales);
      throw std::bad_alloc();
    }
  }
  ~PackBuffers() {
    std::free(panels);
    std::free(columns);
    std::free(scales);
  }
};

inline PackBuffers& pack_buffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

// Packs weight rows [o0, o0 + nc) x elements [k0, k0 + kc) into panels of
// kNR columns (columns past nc are zero: they add nothing).
template <class Q, class Decoder>
void pack_panels(DType type, const uint8_t* base, size_t row_bytes, int64_t o0, int64_t nc,
                 int64_t k0, int64_t kc, PackBuffers& buf) {
  constexpr int64_t kAhead = 4;
  constexpr int kG = Decoder::kGroup;
  const int64_t n_groups = kc / kG;
  const size_t panel_bytes = static_cast<size_t>(kc / kQK) * chunk_bytes(kG);
  float* scales = buf.scales;
  float* offs = buf.scales + kNR * (kMaxKC / 16);
  for (int64_t p0 = 0; p0 < nc; p0 += kNR) {
    const int64_t np = nc - p0 < kNR ? nc - p0 : kNR;
    for (int64_t c = 0; c < kNR; ++c) {
      uint8_t* q = buf.columns + c * kMaxKC;
      float* sc = scales + c * (kMaxKC / 16);
      float* of = offs + c * (kMaxKC / 16);
      if (c < np) {
        // The weights stream from memory once per call: while a row is
        // decoded, the same range of the row kAhead rows later is fetched.
        const size_t k_offset =
            static_cast<size_t>(k0 / dtype_block_elems(type)) * dtype_block_bytes(type);
        const size_t k_bytes =
            static_cast<size_t>(kc / dtype_block_elems(type)) * dtype_block_bytes(type);
        if (p0 + c + kAhead < nc) {
          const char* next = reinterpret_cast<const char*>(base) +
                             static_cast<size_t>(o0 + p0 + c + kAhead) * row_bytes + k_offset;
          for (size_t off = 0; off < k_bytes; off += 64) __builtin_prefetch(next + off);
        }
        ColumnSink<Q, kG> sink{q, sc, of, k0};
        Decoder::decode(base + static_cast<size_t>(o0 + p0 + c) * row_bytes, k0, k0 + kc, sink);
      } else {
        __builtin_memset(q, 0, static_cast<size_t>(kc));
        for (int64_t g = 0; g < n_groups; ++g) sc[g] = of[g] = 0.0f;
      }
    }
    uint8_t* panel = buf.panels + static_cast<size_t>(p0 / kNR) * panel_bytes;
    for (int64_t ch = 0; ch < kc / kQK; ++ch) {
      uint8_t* dst = panel + static_cast<size_t>(ch) * chunk_bytes(kG);
      // The 16 columns' 32 quant bytes (8 dwords each) transposed: step k4
      // of the chunk is dword k4 of every column.
      Q::transpose16x8(reinterpret_cast<const float*>(buf.columns + ch * kQK), kMaxKC / 4,
                       reinterpret_cast<float*>(dst));
      float* dsc = reinterpret_cast<float*>(dst + 8 * 64);
      for (int64_t g = 0; g < 32 / kG; ++g) {
        for (int64_t c = 0; c < kNR; ++c) {
          dsc[2 * kNR * g + c] = scales[c * (kMaxKC / 16) + ch * (32 / kG) + g];
          dsc[2 * kNR * g + kNR + c] = offs[c * (kMaxKC / 16) + ch * (32 / kG) + g];
        }
      }
    }
  }
}

// The activation rows of a call: row r's quants at qs + r * n_in, its
// block scales at d + r * (n_in / 32), its group sums at s + r * lds.
struct Rows {
  const int8_t* qs;
  const float* d;
  const float* s;
  int64_t n_in;
  int64_t lds;
};

// y[r][0..ncols) (+)= rows r < mr over the k-block's n_chunks chunks of 32,
// for np panels of 16 columns (panel p at panels + p * panel_bytes); stores
// when first, else adds.  x points at the k-block's first element of row 0
// (qs), block (d) and group (s).
using MicroKernel = void (*)(const Rows& x, const uint8_t* panels, size_t panel_bytes,
                             int64_t n_chunks, float* y, int64_t ldy, int64_t ncols, bool first);

// The k-block length: n_in split into equal parts of at most kMaxKC,
// rounded up to the type's block size.  Depends on n_in and the type only.
inline int64_t k_block(int64_t n_in, int64_t block) {
  const int64_t parts = (n_in + kMaxKC - 1) / kMaxKC;
  const int64_t kc = (n_in + parts - 1) / parts;
  return (kc + block - 1) / block * block;
}

template <class Isa, class Decoder, int NP, int... MR>
MicroKernel pick_rows(int mr, std::integer_sequence<int, MR...>) {
  MicroKernel k = nullptr;
  ((mr == MR + 1 ? (k = Isa::template kernel<MR + 1, NP, Decoder>, 0) : 0), ...);
  return k;
}

// Isa's micro-kernel for 1 <= mr <= kMR rows and 1 <= np <= kNP panels.
template <class Isa, class Decoder>
MicroKernel pick_kernel(int mr, int np) {
  constexpr auto rows = std::make_integer_sequence<int, Isa::kMR>{};
  if constexpr (Isa::kNP == 2) {
    if (np == 2) return pick_rows<Isa, Decoder, 2>(mr, rows);
  }
  return pick_rows<Isa, Decoder, 1>(mr, rows);
}

template <class Isa, class Decoder>
void gemm(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
          int64_t o_begin, int64_t o_end) {
  constexpr int kG = Decoder::kGroup;
  const size_t row_bytes = dtype_row_bytes(w.type, w.n_in);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  PackBuffers& buf = pack_buffers();
  const int64_t kc_max = k_block(w.n_in, dtype_block_elems(w.type));
  const size_t panel_max = static_cast<size_t>(kc_max / kQK) * chunk_bytes(kG);
  const int64_t nc_max = static_cast<int64_t>(kPackBytes / panel_max) * kNR;
  const int64_t nb = w.n_in / kQK;
  const float* sums = kG == 16 ? s16 : x.s;
  const int64_t lds = w.n_in / kG;
  for (int64_t o0 = o_begin; o0 < o_end; o0 += nc_max) {
    const int64_t nc = o_end - o0 < nc_max ? o_end - o0 : nc_max;
    for (int64_t k0 = 0; k0 < w.n_in; k0 += kc_max) {
      const int64_t kc = w.n_in - k0 < kc_max ? w.n_in - k0 : kc_max;
      pack_panels<typename Isa::Quants, Decoder>(w.type, base, row_bytes, o0, nc, k0, kc, buf);
      const size_t panel_bytes = static_cast<size_t>(kc / kQK) * chunk_bytes(kG);
      const bool first = k0 == 0;
      for (int64_t r0 = 0; r0 < n_rows; r0 += Isa::kMR) {
        const int mr = static_cast<int>(n_rows - r0 < Isa::kMR ? n_rows - r0 : Isa::kMR);
        const Rows rows{x.qs + r0 * w.n_in + k0, x.d + r0 * nb + k0 / kQK,
                        sums + r0 * lds + k0 / kG, w.n_in, lds};
        float* yr = y + r0 * w.n_out + o0;
        for (int64_t p0 = 0; p0 < nc; p0 += Isa::kNP * kNR) {
          const int64_t ncols = nc - p0 < Isa::kNP * kNR ? nc - p0 : Isa::kNP * kNR;
          const uint8_t* panels = buf.panels + static_cast<size_t>(p0 / kNR) * panel_bytes;
          const int np = static_cast<int>((ncols + kNR - 1) / kNR);
          const MicroKernel kernel = pick_kernel<Isa, Decoder>(mr, np);
          kernel(rows, panels, panel_bytes, kc / kQK, yr + p0, w.n_out, ncols, first);
        }
      }
    }
  }
}

// fn(Decoder{}) for the decoder of type t (its 32 quant bytes handled by
// Q); false for the float types.
template <class Q, class Fn>
bool with_decoder(DType t, Fn&& fn) {
  switch (t) {
    case DType::Q8_0:
      return fn(Int8Q8_0<Q>{});
    case DType::Q4_0:
      return fn(Int8Q4_0<Q>{});
    case DType::Q4_1:
      return fn(Int8Q4_1<Q>{});
    case DType::Q5_0:
      return fn(Int8Q5_0<Q>{});
    case DType::Q5_1:
      return fn(Int8Q5_1<Q>{});
    case DType::IQ4_NL:
      return fn(Int8IQ4_NL<Q>{});
    case DType::IQ4_XS:
      return fn(Int8IQ4_XS<Q>{});
    case DType::Q2_K:
      return fn(Int8Q23_K<Q, BlockQ2_K>{});
    case DType::Q3_K:
      return fn(Int8Q23_K<Q, BlockQ3_K>{});
    case DType::Q4_K:
      return fn(Int8Q45_K<Q, BlockQ4_K>{});
    case DType::Q5_K:
      return fn(Int8Q45_K<Q, BlockQ5_K>{});
    case DType::Q6_K:
      return fn(Int8Q6_K<Q>{});
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      break;
  }
  return false;
}

template <class Isa>
bool supported(DType t) {
  return with_decoder<typename Isa::Quants>(
      t, [](auto d) { return Isa::template supports<decltype(d)>; });
}

// The types whose decoders have groups of 16.
template <class Isa>
bool uses_half_sums(DType t) {
  return with_decoder<typename Isa::Quants>(t, [](auto d) { return decltype(d)::kGroup == 16; });
}

// Returns false (and computes nothing) for a type the Isa does not support.
template <class Isa>
bool gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end) {
  if (n_rows <= 0 || o_begin >= o_end) return true;
  return with_decoder<typename Isa::Quants>(w.type, [&](auto d) {
    if constexpr (Isa::template supports<decltype(d)>) {
      gemm<Isa, decltype(d)>(w, x, s16, n_rows, y, o_begin, o_end);
      return true;
    }
    return false;
  });
}

}  // namespace
}  // namespace cb::int8_tiles
