// The int8 GEMV of decode at the avx512 level (see gemv_q8_x86.h): one
// VPDPBUSD per block's dot product, a masked add for the fifth bit of Q5_0
// and Q5_1.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers start conversions from undefined vectors, which
// -Wmaybe-uninitialized reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CB_GEMV_LEVEL avx512
#include "kernels/cpu/gemv_q8_x86.h"
