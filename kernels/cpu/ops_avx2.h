// The AVX2+FMA+F16C kernels.  Declared in plain C++ so the dispatching code
// (compiled for the baseline ISA) can call them; defined in *_avx2.cpp files
// that CMake compiles with -mavx2 -mfma -mf16c.  Call them only after
// cpu_features() reports avx2, fma and f16c.  Same contracts as the
// functions of the same name in reference_ops.h.
//
// Linkage rule for the AVX2 files: nothing they define or include may be an
// ordinary `inline` function or template shared with baseline code (std
// containers, std math wrappers).  The linker keeps one copy of such a
// function, possibly the AVX-encoded one, which would crash a CPU without
// AVX.  So their helpers have internal linkage (`static inline` or an
// anonymous namespace), math goes through __builtin_*, buffers are malloc'd.
//
// Numerics: matmul keeps activations f32 and every sum accumulates in f32,
// so the model's logits (prefill) stay within a relative L2 of 1e-3 of a
// float64 reference; the only differences from cb::ref are summation order,
// FMA contraction and a polynomial exp (~1e-7 relative).  Only gemv_q8
// and gemm_q8 multiply int8-quantized activations, by request of the caller.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"

namespace cb::avx2 {

// Output columns [o_begin, o_end).  n_rows == 1 is a fused dequantize+dot
// GEMV; n_rows > 1 dequantizes a tile of weight rows once into a per-thread
// f32 buffer and multiplies it by every activation row.
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end);

// Query rows [q_begin, q_end) x query heads [h_begin, h_end); the heads must
// share one KV head (lie in one GQA group).  Tiled over blocks of keys with
// an online softmax; each K/V block is loaded once for all rows of the tile.
void attention_tile(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                    int64_t h_end);
// The keys of one KV head g, transposed once for all the tiles that read
// it: key block b (kAttentionKeyBlock keys from b * kAttentionKeyBlock) is
// a head_dim x kAttentionKeyBlock block at
// key_blocks + b * head_dim * kAttentionKeyBlock, keys past n_kv zero.
// Without it each tile transposes every block it reads, which costs a
// tenth of the tile's work.
constexpr int64_t kAttentionKeyBlock = 32;
inline int64_t attention_key_blocks(int64_t n_kv) {
  return (n_kv + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
}
// Writes blocks [b_begin, b_end) of KV head g into key_blocks (head_dim <= 256).
void transpose_key_blocks(const AttentionArgs& a, int64_t g, int64_t b_begin, int64_t b_end,
                          float* key_blocks);
// attention_tile reading the transposed keys; the same results, bit for bit.
void attention_tile(const AttentionArgs& a, const float* key_blocks, int64_t q_begin, int64_t q_end,
                    int64_t h_begin, int64_t h_end);
// One query row, one head (a tile of one row).
void attention_one(const AttentionArgs& a, int64_t qi, int64_t head);
// n elements rounded to f16 (to nearest, ties to even: the bits of
// cb::f32_to_f16) and widened back (exact): the rows of an F16 KV cache.
void f32_to_f16_row(const float* src, int64_t n, uint16_t* dst);
void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst);
// The weights of Backend::attention_contributions for one query head: adds
// each key's attention weight over every query row to sums[0, n_kv).
void attention_weight_sums_head(const AttentionArgs& a, int64_t head, float* sums);

// The int8 GEMV of decode (Backend::matmul_q8); same contracts as
// ref::quantize_q8a (same bytes) and ref::gemv_q8 (same integer sums, f32
// summation order may differ).
void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s);
void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);
// The int8 GEMM of prefill, with ops_avx512.h's contracts, for the types
// whose quants fit its 16-bit products (gemm_q8_supported: all but Q8_0,
// IQ4_NL and IQ4_XS); the same bits as the avx512 level's.
bool gemm_q8_supported(DType t);
// Whether gemm_q8 (at either level) reads s16 for this type (the others
// take null).
bool gemm_q8_uses_half_sums(DType t);
void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end);

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(const float* a, const float* b, int64_t n, float* out);

}  // namespace cb::avx2

// The int8 GEMM with AVX-VNNI (gemm_q8_avxvnni.cpp: VEX VPDPBUSD on ymm),
// the avx2-vnni level's, which runs the AVX2 kernels for everything else:
// every quantized type, the bits of the other int8 GEMMs, s16 as avx2's.
// Only where cpu_features().avx_vnni.
namespace cb::avxvnni {

bool gemm_q8_supported(DType t);
void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end);

}  // namespace cb::avxvnni
