// A backend whose alloc_buffer() memory the host cannot touch, as a
// discrete GPU's device memory: it runs every op on the CPU backend, but
// between ops (and uploads) its buffers are mapped PROT_NONE, so host code
// that reads or writes them directly dies with SIGSEGV at the very access.
// It asks for staged uploads, as a discrete GPU does.  While one thread is
// inside an op the buffers are open to every thread: an access from another
// thread then goes unnoticed (never the reverse: nothing correct faults).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "kernels/backend.h"
#include "kernels/forwarding_backend.h"
#include "platform/error.h"

namespace cb::test {

class DeviceOnlyBackend final : public ForwardingBackend {
 public:
  explicit DeviceOnlyBackend(int n_threads = 2) : ForwardingBackend(make_cpu_backend(n_threads)) {
    void* p =
        mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail(ErrorCode::kOutOfMemory, "device-only test memory: mmap failed");
    base_ = static_cast<char*>(p);
  }
  ~DeviceOnlyBackend() override { munmap(base_, kReserve); }

  const char* name() const override { return "device-only"; }
  bool wants_staged_uploads() const override { return true; }

  // Bump allocation in one reservation, so that one mprotect opens or
  // closes every buffer; freeing does nothing (the pages stay until the
  // backend goes), so addresses are never reused.
  void* alloc_buffer(size_t bytes) override {
    std::lock_guard lock(mu_);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    if (used_ + rounded > kReserve)
      fail(ErrorCode::kOutOfMemory, "device-only test memory is full");
    char* p = base_ + used_;
    used_ += rounded;
    protect_locked();
    return p;
  }
  void free_buffer(void*) override {}
  void upload(void* dst, const void* src, size_t bytes) override {
    Open open(*this);
    std::memcpy(dst, src, bytes);
  }

  // How many ops and uploads ran with the buffers open.
  int64_t opened() {
    std::lock_guard lock(mu_);
    return opened_;
  }

 private:
  static constexpr size_t kReserve = size_t{64} << 30;  // address space only

  struct Open {
    explicit Open(DeviceOnlyBackend& be) : be(be) { be.open(); }
    ~Open() { be.close(); }
    DeviceOnlyBackend& be;
  };
  void open() {
    std::lock_guard lock(mu_);
    ++open_;
    ++opened_;
    protect_locked();
  }
  void close() {
    std::lock_guard lock(mu_);
    --open_;
    protect_locked();
  }
  void protect_locked() {
    if (used_ == 0) return;
    if (mprotect(base_, used_, open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
      fail(ErrorCode::kInternal, "device-only test memory: mprotect failed");
  }
  void on_op_begin(BackendOp, std::initializer_list<const void*>) override { open(); }
  void on_op_end(BackendOp) override { close(); }

  std::mutex mu_;
  char* base_ = nullptr;
  size_t used_ = 0;
  int open_ = 0;
  int64_t opened_ = 0;
};

}  // namespace cb::test
