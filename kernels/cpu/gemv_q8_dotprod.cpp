// The NEON int8 GEMV of decode with SDOT (gemv_q8_neon.h): one instruction
// for 16 byte products where the baseline needs three.  Built and called as
// gemm_q8_dotprod.cpp is (only at the neon-dotprod level); the same bits as
// neon::gemv_q8.
#include <arm_neon.h>

#include <cstdint>

#include "kernels/cpu/gemv_q8_neon.h"
#include "kernels/cpu/ops_neon.h"

namespace cb::neon {
namespace {

struct Sdot {
  static int32x4_t dot16(int8x16_t w, int8x16_t x, int32x4_t acc) { return vdotq_s32(acc, w, x); }
};

}  // namespace

void gemv_q8_dotprod(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin,
                     int64_t o_end) {
  int8_gemv<Sdot>(w, x, y, o_begin, o_end);
}

}  // namespace cb::neon
