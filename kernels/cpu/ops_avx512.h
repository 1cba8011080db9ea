// The AVX-512 kernels: AVX-512 F, BW, VL and VNNI (Intel Ice Lake and
// later, AMD Zen 4 and later).  Declared in plain C++ so the dispatching
// code (compiled for the baseline ISA) can call them; defined in
// *_avx512.cpp files that CMake compiles with those extensions on top of
// AVX2+FMA+F16C.  Call them only after cpu_features() reports them all.
// The linkage rule of ops_avx2.h applies.
//
// The avx512 level runs the AVX2 kernels for every op but these.  gemv_q8
// and quantize_q8a have ops_avx2.h's contracts (the same bytes, the same
// integer sums); gemm_q8 gives the avx2 level's bits where both have it.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"

namespace cb::avx512 {

// The int8 GEMM of prefill (Backend::matmul_q8 with many rows): output
// columns [o_begin, o_end) of y = W x for n_rows activation rows quantized
// as Q8Row (row r at qs + r * n_in, d and s + r * n_in / 32), whose sums
// over each half-block of 16, s16 (row r at s16 + r * n_in / 16: d * the
// sum of the half's quants), the types with a scale per 16 use (Q2_K,
// Q3_K, Q6_K).  Per group of 32 (or 16) elements the integer products are
// exact; the scaled group sums accumulate in f32 in group order, so every
// output is the same chain whatever the split over threads.
bool gemm_q8_supported(DType t);
void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s);
void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);
void gemm_q8(const WeightView& w, const Q8Row& x, const float* s16, int64_t n_rows, float* y,
             int64_t o_begin, int64_t o_end);

}  // namespace cb::avx512
