// The CUDA tests' fixture: a backend on device 0 (each test skips with a
// message where there is none) and its buffers, freed after the test.  Its
// buffers are managed memory, which the tests fill and read from the host
// (the runtime's default, device memory, is reached only through ops and
// uploads).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_backend.h"

namespace cb::test {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none): the CUDA backend is "
                      "compiled but not exercised here";
    }
    CudaBackendOptions o;
    o.memory = CudaMemory::kManaged;
    be_ = make_cuda_backend(0, o);
  }

  void TearDown() override {
    for (void* p : buffers_) be_->free_buffer(p);
  }

  // A backend (managed) buffer holding v.
  template <class T>
  T* dev(const std::vector<T>& v) {
    T* p = static_cast<T*>(be_->alloc_buffer(v.size() * sizeof(T)));
    buffers_.push_back(p);
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }

  template <class T>
  static std::vector<T> host(const T* p, size_t n) {
    return std::vector<T>(p, p + n);
  }

  std::unique_ptr<Backend> be_;
  std::vector<void*> buffers_;
};

}  // namespace cb::test
