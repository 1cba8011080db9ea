// The NEON kernels for 64-bit Arm (AArch64, where Advanced SIMD is part of
// the baseline ISA).  Declared in plain C++; defined in *_neon.cpp files,
// which CMake compiles only for aarch64 targets.  Same contracts as the
// functions of the same name in reference_ops.h and ops_avx2.h.
//
// Numerics: as the AVX2 kernels — matmul keeps activations f32 and every
// sum accumulates in f32, so the model's prefill logits stay within a
// relative L2 of 1e-3 of a float64 reference.  gemv_q8 (decode) multiplies
// int8 weights by int8-quantized activations with the baseline widening
// multiplies (SMULL/SMLAL into int16, SADALP into int32), so it runs on
// every AArch64 core.  gemv_q8_dotprod and gemm_q8 (decode and prefill at
// the neon-dotprod level) take SDOT from the dot-product extension: they
// live in *_dotprod.cpp files, built for that extension, and are called
// only on a core that has it.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"

namespace cb::neon {

// Output columns [o_begin, o_end).  n_rows == 1: GEMV (fused for Q4_0, Q4_1
// and Q8_0, through a dequantized row for the other types); n_rows > 1: a
// packed, register-tiled GEMM (6 rows x 16 columns per micro-tile).
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end);

// Query rows [q_begin, q_end) x query heads [h_begin, h_end) of one KV head;
// tiled with an online softmax as avx2::attention_tile.
void attention_tile(const AttentionArgs& a, int64_t q_begin, int64_t q_end, int64_t h_begin,
                    int64_t h_end);

// The int8 GEMV of decode (Backend::matmul_q8); same contracts as
// ref::quantize_q8a (same bytes) and ref::gemv_q8 (same integer sums, f32
// summation order may differ).
void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s);
void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);
// gemv_q8 with SDOT, the same bits; only where cpu_features().dotprod.
void gemv_q8_dotprod(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);

// The int8 GEMM of prefill (many rows of Backend::matmul_q8), as
// avx2::gemm_q8 (ops_avx2.h) with the same bits: for the types
// gemm_q8_supported names (all but Q8_0, IQ4_NL and IQ4_XS); s16 holds the
// activations' sums per half block where gemm_q8_uses_half_sums(t).  Only
// where cpu_features().dotprod.
bool gemm_q8_supported(DType t);
bool gemm_q8_uses_half_sums(DType t);
void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end);

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(const float* a, const float* b, int64_t n, float* out);
// n elements rounded to f16 (FCVTN with the default FPCR: to nearest, ties
// to even, the bits of cb::f32_to_f16) and widened back (exact).
void f32_to_f16_row(const float* src, int64_t n, uint16_t* dst);
void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst);

}  // namespace cb::neon
