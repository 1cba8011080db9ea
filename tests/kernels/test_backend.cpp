// Backend plumbing: memory, weight preparation, names, kernel level choice.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"

namespace cb {
namespace {

TEST(CpuBackend, AllocatesAligned) {
  auto be = make_cpu_backend(1);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{1} << 20}) {
    void* p = be->alloc_buffer(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    if (bytes > 0) std::memset(p, 0xAB, bytes);
    be->free_buffer(p);
  }
  be->free_buffer(nullptr);
}

TEST(CpuBackend, OutOfMemoryIsAnError) {
  auto be = make_cpu_backend(1);
  try {
    be->alloc_buffer(std::numeric_limits<size_t>::max() / 2);
    FAIL() << "expected kOutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
  }
}

TEST(CpuBackend, PrepareWeightIsIdentity) {
  auto be = make_cpu_backend(1);
  const int dummy = 0;
  const WeightView w{&dummy, DType::Q4_K, 256, 3};
  const WeightView p = be->prepare_weight(w);
  EXPECT_EQ(p.data, w.data);
  EXPECT_EQ(p.type, w.type);
  EXPECT_EQ(p.n_in, w.n_in);
  EXPECT_EQ(p.n_out, w.n_out);
}

TEST(CpuBackend, KernelLevelNames) {
  const std::pair<CpuKernelLevel, std::string> kNames[] = {
      {CpuKernelLevel::kScalar, "scalar"},      {CpuKernelLevel::kAvx2, "avx2"},
      {CpuKernelLevel::kAvx2Vnni, "avx2-vnni"}, {CpuKernelLevel::kAvx512, "avx512"},
      {CpuKernelLevel::kNeon, "neon"},          {CpuKernelLevel::kNeonDotprod, "neon-dotprod"}};
  // all_levels() lists this CPU's levels, the best (the one kAuto takes) last.
  const std::vector<CpuKernelLevel> levels = test::all_levels();
  for (const auto& [l, name] : kNames) {
    CpuKernelLevel parsed;
    ASSERT_TRUE(parse_cpu_kernel_level(name, &parsed));
    EXPECT_EQ(parsed, l) << name;
    if (l == levels.back()) {
      EXPECT_EQ(cpu_kernel_level_name(), name);
      EXPECT_EQ(std::string(make_cpu_backend(1)->name()), "cpu-" + name);
    }
    if (std::find(levels.begin(), levels.end(), l) != levels.end()) {
      EXPECT_EQ(std::string(make_cpu_backend(1, l)->name()), "cpu-" + name);
    } else {
      EXPECT_THROW(make_cpu_backend(1, l), Error) << name;
    }
  }
}

// CB_CPU_KERNELS names the level kAuto takes, with the errors of asking
// for that level by name.
TEST(CpuBackend, EnvironmentNamesTheAutomaticLevel) {
  const char* before = std::getenv("CB_CPU_KERNELS");
  const std::string saved = before != nullptr ? before : "";
  unsetenv("CB_CPU_KERNELS");
  const std::string best = cpu_kernel_level_name();
  const auto error_of = [](const char* value) -> std::pair<ErrorCode, std::string> {
    setenv("CB_CPU_KERNELS", value, 1);
    try {
      make_cpu_backend(1);
    } catch (const Error& e) {
      return {e.code(), e.what()};
    }
    return {ErrorCode::kInternal, "no error"};
  };
  const std::vector<CpuKernelLevel> levels = test::all_levels();
  for (const char* name : {"scalar", "avx2", "avx2-vnni", "avx512", "neon", "neon-dotprod"}) {
    CpuKernelLevel level;
    ASSERT_TRUE(parse_cpu_kernel_level(name, &level));
    if (std::find(levels.begin(), levels.end(), level) != levels.end()) {
      setenv("CB_CPU_KERNELS", name, 1);
      EXPECT_STREQ(cpu_kernel_level_name(), name);
      EXPECT_EQ(std::string(make_cpu_backend(1)->name()), std::string("cpu-") + name);
    } else {
      const auto [code, message] = error_of(name);
      EXPECT_EQ(code, ErrorCode::kUnsupported) << name;
      EXPECT_NE(message.find(std::string("CB_CPU_KERNELS=") + name + ": "), std::string::npos)
          << message;
    }
  }
  for (const char* value : {"auto", ""}) {
    setenv("CB_CPU_KERNELS", value, 1);
    EXPECT_EQ(cpu_kernel_level_name(), best) << "'" << value << "'";
  }
  for (const char* value : {"AVX2", "avx2 ", "sse"}) {
    const auto [code, message] = error_of(value);
    EXPECT_EQ(code, ErrorCode::kInvalidArgument) << value;
    EXPECT_NE(message.find("is not a kernel level"), std::string::npos) << message;
  }
  if (before != nullptr) {
    setenv("CB_CPU_KERNELS", saved.c_str(), 1);
  } else {
    unsetenv("CB_CPU_KERNELS");
  }
}

}  // namespace
}  // namespace cb
