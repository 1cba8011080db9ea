// What the CPU we run on can execute, detected once at first use.  Kernel
// dispatch (kernels/cpu) consults this before calling any code compiled for
// an instruction set beyond the baseline.
#pragma once

namespace cb {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx_vnni = false;  // AVX-VNNI: VPDPBUSD with a VEX encoding (ymm)
  // AArch64: Advanced SIMD (always present there) and the int8 dot-product
  // instructions (SDOT/UDOT, Armv8.2-A's optional FEAT_DotProd).
  bool neon = false;
  bool dotprod = false;
};

// Cached after the first call; thread-safe.  The x86 fields are false on
// other CPUs and the Arm fields false on non-Arm ones.
const CpuFeatures& cpu_features();

// Number of hardware threads (at least 1).
int cpu_hardware_threads();

}  // namespace cb
