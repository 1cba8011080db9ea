#include "platform/cpu_features.h"

#include <thread>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace cb {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports reads cpuid and, for the AVX families, also checks
  // that the OS saves the wide registers (XGETBV), so a true here means the
  // instructions are usable, not just present.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // clang 14 has no "f16c" for __builtin_cpu_supports: read CPUID.1:ECX[29]
  // and require usable AVX, whose registers the conversions use.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0 &&
           __builtin_cpu_supports("avx");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // AVX-VNNI is CPUID.(7,1):EAX[4]; its registers are AVX's.
  f.avx_vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0 &&
               __builtin_cpu_supports("avx");
#endif
#if defined(__aarch64__)
  f.neon = true;  // part of the AArch64 baseline
#if defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  f.dotprod = (hwcap & HWCAP_ASIMDDP) != 0;
#endif
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

int cpu_hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace cb
