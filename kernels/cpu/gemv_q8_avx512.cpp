// The int8 GEMV of decode at the avx512 level (see gemv_q8_x86.h): one
// VPDPBUSD per block's dot product, a masked add for the fifth bit of Q5_0
// and Q5_1, and 512-bit steps for Q4_K and Q6_K rows.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers start conversions, inserts and reductions from
// undefined vectors, which -W(maybe-)uninitialized reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define CB_GEMV_LEVEL avx512
#include "kernels/cpu/gemv_q8_x86.h"
