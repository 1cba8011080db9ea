// A backend that completes the ops of a batch as late as Backend allows,
// as a GPU backend's stream does: between begin_batch() and the outermost
// end_batch() of a thread, an op whose outputs are all alloc_buffer()
// memory is queued (with copies of its host inputs, which the caller may
// reuse once it returns) and runs only at that end_batch(), at the thread's
// next op outside a batch or with a host output, or at its free_buffer().
// So host code that reads a buffer a batch writes before the batch has
// ended sees stale numbers here, as it would on a GPU, and a test comparing
// with the CPU backend fails.  Freeing memory that another thread's queued
// op uses fails the test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/runtime/counting_backends.h"

namespace cb::test {

class DeferringBackend final : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  const char* name() const override { return "deferring"; }

  // Ops that were queued rather than run at once (every thread's).
  std::atomic<int64_t> deferred{0};

  void begin_batch() override {
    std::lock_guard lock(mu_);
    ++threads_[std::this_thread::get_id()].depth;
  }
  void end_batch() override {
    Thread* t;
    {
      std::lock_guard lock(mu_);
      t = &threads_[std::this_thread::get_id()];
      ASSERT_GT(t->depth, 0) << "end_batch without begin_batch";
      if (--t->depth > 0) return;
    }
    run_queued(*t);
  }
  // The calling thread's queued ops complete first, as Backend asks; an op
  // another thread queued on the memory fails the test (and the memory is
  // leaked rather than written after its free).
  void free_buffer(void* p) override {
    run_queued(self());
    const char* start = nullptr;
    size_t bytes = 0;
    if (in_buffer(p, &start, &bytes)) {
      std::lock_guard lock(mu_);
      for (const auto& [id, t] : threads_)
        for (const Pending& op : t.queue)
          for (const void* a : op.args) {
            const char* c = static_cast<const char*>(a);
            if (c >= start && c < start + bytes) {
              ADD_FAILURE() << "a buffer freed under another thread's queued op";
              return;  // leaked: the queued op must not write freed memory
            }
          }
    }
    CountingBackend::free_buffer(p);
  }

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    Pending op;
    const float* hx = op.keep(*this, x, n_rows * w.n_in);
    submit(std::move(op), {y}, [=, this] { CountingBackend::matmul(w, hx, n_rows, y); });
  }
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    Pending op;
    const float* hx = op.keep(*this, x, n_rows * w.n_in);
    submit(std::move(op), {y}, [=, this] { CountingBackend::matmul_q8(w, hx, n_rows, y); });
  }
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    Pending op;
    const float* hx = op.keep(*this, x, n_rows * w.n_in);
    const float* hb = op.keep(*this, bias, w.n_out);
    submit(std::move(op), {y},
           [=, this] { CountingBackend::matmul_bias(w, hx, n_rows, hb, y, q8); });
  }
  // Its ops one by one, through the overrides here (ForwardingBackend's
  // product would hand the whole product to the CPU backend unwatched).
  void product(const ProductArgs& a) override { Backend::product(a); }
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    Pending op;
    const int32_t* hi = op.keep(*this, ids, n);
    submit(std::move(op), {out}, [=, this] { CountingBackend::get_rows(w, hi, n, out); });
  }
  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    Pending op;
    const float* hx = op.keep(*this, x, n_rows * dim);
    const float* hw = op.keep(*this, weight, dim);
    submit(std::move(op), {out},
           [=, this] { CountingBackend::rmsnorm(hx, hw, n_rows, dim, eps, out); });
  }
  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    Pending op;
    const int32_t* hp = op.keep(*this, pos, n_rows);
    const float* hf = op.keep(*this, freq_factors, freq_factors ? rot_dim / 2 : 0);
    submit(std::move(op), {x}, [=, this] {
      CountingBackend::rope(x, hp, n_rows, n_heads, head_dim, rot_dim, freq_base, hf);
    });
  }
  void attention(const AttentionArgs& a) override {
    Pending op;
    AttentionArgs d = a;
    d.q = op.keep(*this, a.q, a.n_q * a.n_head * a.head_dim);
    d.q_pos = op.keep(*this, a.q_pos, a.n_q);
    submit(std::move(op), {a.out, a.k, a.v}, [=, this] { CountingBackend::attention(d); });
  }
  void attention_contributions(const AttentionArgs& a, float* out) override {
    run_queued(self());  // `out` is host memory by contract
    CountingBackend::attention_contributions(a, out);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    Pending op;
    const float* hg = op.keep(*this, gate, n);
    const float* hu = op.keep(*this, up, n);
    submit(std::move(op), {out}, [=, this] { CountingBackend::silu_mul(hg, hu, n, out); });
  }
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    Pending op;
    const float* hg = op.keep(*this, gate, n);
    const float* hu = op.keep(*this, up, n);
    submit(std::move(op), {out}, [=, this] { CountingBackend::gelu_mul(hg, hu, n, out); });
  }
  void scale(float* x, int64_t n, float s) override {
    submit(Pending{}, {x}, [=, this] { CountingBackend::scale(x, n, s); });
  }
  void add(const float* a, const float* b, int64_t n, float* out) override {
    Pending op;
    const float* ha = op.keep(*this, a, n);
    const float* hb = op.keep(*this, b, n);
    submit(std::move(op), {out}, [=, this] { CountingBackend::add(ha, hb, n, out); });
  }
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    Pending op;
    const float* hb = op.keep(*this, bias, dim);
    submit(std::move(op), {x}, [=, this] { CountingBackend::add_bias(x, hb, n_rows, dim); });
  }
  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    Pending op;
    const int32_t* hi = op.keep(*this, idx, n);
    // A host source's extent: 1 + the largest row index.
    int64_t rows = 0;
    if (!in_backend_memory(src))
      for (int64_t i = 0; i < n; ++i) rows = std::max<int64_t>(rows, hi[i] + 1);
    const float* hs = op.keep(*this, src, rows * row_len);
    submit(std::move(op), {dst},
           [=, this] { CountingBackend::gather_rows(hs, row_len, hi, n, dst); });
  }
  void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                     float* out) override {
    Pending op;
    const int32_t* hs = op.keep(*this, seg, n_seg + 1);
    submit(std::move(op), {x, out},
           [=, this] { CountingBackend::segment_means(x, row_len, hs, n_seg, out); });
  }
  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    Pending op;
    const float* ha = op.keep(*this, a, n_rows * row_len);
    const float* hb = op.keep(*this, b, n_rows * row_len);
    submit(std::move(op), {out},
           [=, this] { CountingBackend::row_sq_diff(ha, hb, n_rows, row_len, out); });
  }
  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    Pending op;
    const float* hs = op.keep(*this, src, n * row_len);
    const int32_t* hi = op.keep(*this, idx, n);
    submit(std::move(op), {dst},
           [=, this] { CountingBackend::scatter_rows(hs, row_len, hi, n, dst); });
  }
  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    Pending op;
    const float* hs = op.keep(*this, src, n * row_len);
    const int32_t* hi = op.keep(*this, idx, n);
    submit(std::move(op), {dst},
           [=, this] { CountingBackend::scatter_rows_f16(hs, row_len, hi, n, dst); });
  }
  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    Pending op;
    const int32_t* hi = op.keep(*this, idx, n);
    submit(std::move(op), {dst, src},
           [=, this] { CountingBackend::gather_rows_f16(src, row_len, hi, n, dst); });
  }
  void top_k(const float* values, int64_t n, int64_t k, int32_t* out) override {
    run_queued(self());  // `out` is host memory by design
    CountingBackend::top_k(values, n, k, out);
  }

 private:
  // A queued op: its copies of host inputs and the pointers it uses.
  struct Pending {
    std::deque<std::vector<char>> copies;
    std::vector<const void*> args;
    std::function<void()> run;
    // p itself when it is backend memory (read when the op runs), else a
    // copy of its n elements as they are now.
    template <class T>
    const T* keep(DeferringBackend& be, const T* p, int64_t n) {
      if (p == nullptr || n <= 0 || be.in_backend_memory(p)) {
        args.push_back(p);
        return p;
      }
      auto& c = copies.emplace_back(reinterpret_cast<const char*>(p),
                                    reinterpret_cast<const char*>(p + n));
      return reinterpret_cast<const T*>(c.data());
    }
  };
  struct Thread {
    int depth = 0;
    std::deque<Pending> queue;
  };

  Thread& self() {
    std::lock_guard lock(mu_);
    return threads_[std::this_thread::get_id()];
  }
  int depth(const Thread& t) {
    std::lock_guard lock(mu_);
    return t.depth;
  }
  // Runs the thread's queued ops in order.
  void run_queued(Thread& t) {
    std::deque<Pending> q;
    {
      std::lock_guard lock(mu_);
      q.swap(t.queue);
    }
    for (Pending& op : q) op.run();
  }
  // Queues the op inside a batch when `mem` (its outputs, and inputs it
  // reads in place) are all alloc_buffer() memory, else runs what is queued
  // and then the op.
  void submit(Pending op, std::initializer_list<const void*> mem, std::function<void()> run) {
    Thread& t = self();
    const bool later = depth(t) > 0 && std::all_of(mem.begin(), mem.end(),
                                                   [&](const void* p) { return in_buffer(p); });
    if (!later) {
      run_queued(t);
      run();
      return;
    }
    op.args.insert(op.args.end(), mem.begin(), mem.end());
    op.run = std::move(run);
    ++deferred;
    std::lock_guard lock(mu_);
    t.queue.push_back(std::move(op));
  }

  std::mutex mu_;
  std::map<std::thread::id, Thread> threads_;
};

}  // namespace cb::test
