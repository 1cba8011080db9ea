// The int8 GEMV of decode at the avx2 level (see gemv_q8_x86.h).
#define CB_GEMV_LEVEL avx2
#include "kernels/cpu/gemv_q8_x86.h"
