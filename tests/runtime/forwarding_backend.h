// Test backends that run every op on the CPU backend while watching, or
// bending, what the runtime asks of a backend: batches, staged uploads.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "platform/error.h"

namespace cb::test {

// Forwards every call to a CPU backend; before_op() runs before each op.
// Counts the staging calls (Backend's defaults: memcpy uploads) and the
// activation arguments of ops that are not alloc_buffer() memory, which a
// GPU backend would have to stage through host copies.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(int n_threads = 2) : inner_(make_cpu_backend(n_threads)) {}

  const char* name() const override { return "forwarding"; }
  void* alloc_buffer(size_t bytes) override {
    void* p = inner_->alloc_buffer(bytes);
    std::lock_guard lock(buffers_mu_);
    buffers_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void free_buffer(void* p) override {
    {
      std::lock_guard lock(buffers_mu_);
      buffers_.erase(static_cast<const char*>(p));
    }
    inner_->free_buffer(p);
  }
  WeightView prepare_weight(const WeightView& host) override {
    return inner_->prepare_weight(host);
  }
  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    op({x, y});
    inner_->matmul(w, x, n_rows, y);
  }
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    op({x, y});
    inner_->matmul_q8(w, x, n_rows, y);
  }
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    op({out});
    inner_->get_rows(w, ids, n, out);
  }
  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    op({x, out});  // the weight is the model's, as mapped
    inner_->rmsnorm(x, weight, n_rows, dim, eps, out);
  }
  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    op({x});
    inner_->rope(x, pos, n_rows, n_heads, head_dim, rot_dim, freq_base, freq_factors);
  }
  void attention(const AttentionArgs& a) override {
    op({a.q, a.k, a.v, a.out});
    inner_->attention(a);
  }
  void attention_contributions(const AttentionArgs& a, float* out) override {
    op({a.q, a.k, a.v});  // `out` is host memory by contract
    inner_->attention_contributions(a, out);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    op({gate, up, out});
    inner_->silu_mul(gate, up, n, out);
  }
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    op({gate, up, out});
    inner_->gelu_mul(gate, up, n, out);
  }
  void scale(float* x, int64_t n, float s) override {
    op({x});
    inner_->scale(x, n, s);
  }
  void add(const float* a, const float* b, int64_t n, float* out) override {
    op({a, b, out});
    inner_->add(a, b, n, out);
  }
  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    op({src, dst});
    inner_->gather_rows(src, row_len, idx, n, dst);
  }
  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    op({a, b, out});
    inner_->row_sq_diff(a, b, n_rows, row_len, out);
  }
  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    op({src, dst});
    inner_->scatter_rows(src, row_len, idx, n, dst);
  }
  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    op({src, dst});
    inner_->scatter_rows_f16(src, row_len, idx, n, dst);
  }
  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    op({src, dst});
    inner_->gather_rows_f16(src, row_len, idx, n, dst);
  }
  void top_k(const float* values, int64_t n, int64_t k, int32_t* out) override {
    op({values});  // out is host memory by design
    inner_->top_k(values, n, k, out);
  }
  void* alloc_host_staging(size_t bytes) override {
    ++staging_allocs;
    return Backend::alloc_host_staging(bytes);
  }
  void free_host_staging(void* p) override {
    ++staging_frees;
    Backend::free_host_staging(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    ++uploads;
    Backend::upload(dst, src, bytes);
  }

  // Loader threads call too.
  std::atomic<int64_t> uploads{0}, staging_allocs{0}, staging_frees{0}, host_args{0};

 protected:
  virtual void before_op() {}
  std::unique_ptr<Backend> inner_;

 private:
  void op(std::initializer_list<const void*> args) {
    before_op();
    std::lock_guard lock(buffers_mu_);
    for (const void* a : args) {
      const char* p = reinterpret_cast<const char*>(a);
      auto it = buffers_.upper_bound(p);
      if (it == buffers_.begin() || p >= std::prev(it)->first + std::prev(it)->second) ++host_args;
    }
  }

  std::mutex buffers_mu_;
  std::map<const char*, size_t> buffers_;  // alloc_buffer() blocks by start
};

// Asks for staged uploads and completes them as late as Backend allows, as
// an asynchronous copy engine may: a copy lands only at the issuing
// thread's next wait_uploads() or op.  So a staging slot rewritten, or a
// layer handed over, before its copy is done shows up as wrong numbers.
// Staging memory starts as NaNs, and freeing it under a pending copy fails
// the test.
class StagingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  // What wait_uploads() reports per completed copy, in "ms".
  static constexpr double kMsPerCopy = 0.001;

  bool wants_staged_uploads() const override { return true; }
  void* alloc_host_staging(size_t bytes) override {
    if (fail_staging) fail(ErrorCode::kOutOfMemory, "no staging memory left (injected)");
    void* p = ForwardingBackend::alloc_host_staging(bytes);
    std::memset(p, 0xff, bytes);
    std::lock_guard lock(mu_);
    staging_[p] = bytes;
    return p;
  }
  void free_host_staging(void* p) override {
    {
      std::lock_guard lock(mu_);
      const size_t bytes = staging_.at(p);
      for (const auto& [thread, copies] : pending_)
        for (const Copy& c : copies)
          if (c.src >= static_cast<const char*>(p) && c.src < static_cast<const char*>(p) + bytes)
            ADD_FAILURE() << "staging memory freed under a pending copy";
      staging_.erase(p);
    }
    ForwardingBackend::free_host_staging(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    ++uploads;
    std::lock_guard lock(mu_);
    pending_[std::this_thread::get_id()].push_back(
        {static_cast<char*>(dst), static_cast<const char*>(src), bytes});
  }
  // Reports every copy completed since the previous call, also those an op
  // completed, as a GPU's timing events would.
  double wait_uploads() override {
    complete_copies();
    std::lock_guard lock(mu_);
    return kMsPerCopy *
           static_cast<double>(std::exchange(unreported_[std::this_thread::get_id()], 0));
  }

  size_t pending_copies() {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto& [thread, copies] : pending_) n += copies.size();
    return n;
  }

  bool fail_staging = false;

 private:
  struct Copy {
    char* dst;
    const char* src;
    size_t bytes;
  };
  void before_op() override { complete_copies(); }
  void complete_copies() {
    std::lock_guard lock(mu_);
    auto& mine = pending_[std::this_thread::get_id()];
    for (const Copy& c : mine) std::memcpy(c.dst, c.src, c.bytes);
    unreported_[std::this_thread::get_id()] += mine.size();
    mine.clear();
  }

  std::mutex mu_;
  std::map<std::thread::id, std::vector<Copy>> pending_;
  std::map<std::thread::id, size_t> unreported_;
  std::map<void*, size_t> staging_;
};

}  // namespace cb::test
