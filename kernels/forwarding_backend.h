// A Backend that runs every call on another backend, with a hook on each
// side of every op: the way to watch what the runtime asks of a backend
// without changing what it computes.  cb_layer_bench times each kind of op
// through it; the tests count batches and host arguments and delay uploads.
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>

#include "kernels/backend.h"

namespace cb {

// The ops a ForwardingBackend reports (every Backend call but memory,
// weights, batches and uploads).
enum class BackendOp : uint8_t {
  kMatmul,
  kMatmulQ8,
  kMatmulBias,
  kProduct,
  kGetRows,
  kRmsnorm,
  kRope,
  kAttention,
  kAttentionContributions,
  kSiluMul,
  kGeluMul,
  kScale,
  kAdd,
  kAddBias,
  kGatherRows,
  kSegmentMeans,
  kRowSqDiff,
  kScatterRows,
  kScatterRowsF16,
  kGatherRowsF16,
  kTopK,
};
inline constexpr int kBackendOpCount = static_cast<int>(BackendOp::kTopK) + 1;

inline const char* backend_op_name(BackendOp op) {
  static constexpr const char* kNames[kBackendOpCount] = {"matmul",
                                                          "matmul_q8",
                                                          "matmul_bias",
                                                          "product",
                                                          "get_rows",
                                                          "rmsnorm",
                                                          "rope",
                                                          "attention",
                                                          "attention_contributions",
                                                          "silu_mul",
                                                          "gelu_mul",
                                                          "scale",
                                                          "add",
                                                          "add_bias",
                                                          "gather_rows",
                                                          "segment_means",
                                                          "row_sq_diff",
                                                          "scatter_rows",
                                                          "scatter_rows_f16",
                                                          "gather_rows_f16",
                                                          "top_k"};
  return kNames[static_cast<int>(op)];
}

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  const char* name() const override { return inner_->name(); }
  int64_t default_batch_rows() const override { return inner_->default_batch_rows(); }
  void* alloc_buffer(size_t bytes) override { return inner_->alloc_buffer(bytes); }
  void free_buffer(void* p) override { inner_->free_buffer(p); }
  WeightView prepare_weight(const WeightView& host) override {
    return inner_->prepare_weight(host);
  }

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    Op op(*this, BackendOp::kMatmul, {x, y}, {w.data});
    inner_->matmul(w, x, n_rows, y);
  }
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    Op op(*this, BackendOp::kMatmulQ8, {x, y}, {w.data});
    inner_->matmul_q8(w, x, n_rows, y);
  }
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    Op op(*this, BackendOp::kMatmulBias, {x, y}, {w.data, bias});
    inner_->matmul_bias(w, x, n_rows, bias, y, q8);
  }
  // products() is Backend's: each product an op of its own here.
  void product(const ProductArgs& a) override {
    Op op(*this, BackendOp::kProduct, {a.x, a.up, a.scratch, a.y}, {a.w->data, a.bias});
    inner_->product(a);
  }
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    Op op(*this, BackendOp::kGetRows, {out}, {w.data});
    inner_->get_rows(w, ids, n, out);
  }
  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    Op op(*this, BackendOp::kRmsnorm, {x, out}, {weight});
    inner_->rmsnorm(x, weight, n_rows, dim, eps, out);
  }
  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    Op op(*this, BackendOp::kRope, {x}, {freq_factors});
    inner_->rope(x, pos, n_rows, n_heads, head_dim, rot_dim, freq_base, freq_factors);
  }
  void attention(const AttentionArgs& a) override {
    Op op(*this, BackendOp::kAttention, {a.q, a.k, a.v, a.out});
    inner_->attention(a);
  }
  void attention_contributions(const AttentionArgs& a, float* out) override {
    Op op(*this, BackendOp::kAttentionContributions, {a.q, a.k, a.v});  // out: host memory
    inner_->attention_contributions(a, out);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    Op op(*this, BackendOp::kSiluMul, {gate, up, out});
    inner_->silu_mul(gate, up, n, out);
  }
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    Op op(*this, BackendOp::kGeluMul, {gate, up, out});
    inner_->gelu_mul(gate, up, n, out);
  }
  void scale(float* x, int64_t n, float s) override {
    Op op(*this, BackendOp::kScale, {x});
    inner_->scale(x, n, s);
  }
  void add(const float* a, const float* b, int64_t n, float* out) override {
    Op op(*this, BackendOp::kAdd, {a, b, out});
    inner_->add(a, b, n, out);
  }
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    Op op(*this, BackendOp::kAddBias, {x}, {bias});
    inner_->add_bias(x, bias, n_rows, dim);
  }
  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    Op op(*this, BackendOp::kGatherRows, {src, dst});
    inner_->gather_rows(src, row_len, idx, n, dst);
  }
  void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                     float* out) override {
    Op op(*this, BackendOp::kSegmentMeans, {x, out});
    inner_->segment_means(x, row_len, seg, n_seg, out);
  }
  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    Op op(*this, BackendOp::kRowSqDiff, {a, b, out});
    inner_->row_sq_diff(a, b, n_rows, row_len, out);
  }
  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    Op op(*this, BackendOp::kScatterRows, {src, dst});
    inner_->scatter_rows(src, row_len, idx, n, dst);
  }
  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    Op op(*this, BackendOp::kScatterRowsF16, {src, dst});
    inner_->scatter_rows_f16(src, row_len, idx, n, dst);
  }
  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    Op op(*this, BackendOp::kGatherRowsF16, {src, dst});
    inner_->gather_rows_f16(src, row_len, idx, n, dst);
  }
  void top_k(const float* values, int64_t n, int64_t k, int32_t* out) override {
    Op op(*this, BackendOp::kTopK, {values});  // out is host memory by design
    inner_->top_k(values, n, k, out);
  }

  void begin_batch() override { inner_->begin_batch(); }
  void end_batch() override { inner_->end_batch(); }
  bool wants_staged_uploads() const override { return inner_->wants_staged_uploads(); }
  void* alloc_host_staging(size_t bytes) override { return inner_->alloc_host_staging(bytes); }
  void free_host_staging(void* p) override { inner_->free_host_staging(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    inner_->upload(dst, src, bytes);
  }
  double wait_uploads() override { return inner_->wait_uploads(); }
  uint64_t resident_kv_bytes() const override { return inner_->resident_kv_bytes(); }

 protected:
  // Before and after every op, on the calling thread; `args` are its
  // activation pointers.  on_op_end runs also when the op throws.  Inside a
  // batch an asynchronous inner backend may still be running the op when
  // on_op_end is called.
  virtual void on_op_begin(BackendOp, std::initializer_list<const void*>) {}
  virtual void on_op_end(BackendOp) {}
  // Before on_op_begin, the op's weight data: a matrix's (WeightView::data),
  // the norm weights and biases, RoPE's frequency factors (null when the op
  // has none).
  virtual void on_op_weights(BackendOp, std::initializer_list<const void*>) {}

  std::unique_ptr<Backend> inner_;

 private:
  struct Op {
    Op(ForwardingBackend& be, BackendOp op, std::initializer_list<const void*> args,
       std::initializer_list<const void*> weights = {})
        : be(be), op(op) {
      be.on_op_weights(op, weights);
      be.on_op_begin(op, args);
    }
    ~Op() { be.on_op_end(op); }
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    ForwardingBackend& be;
    BackendOp op;
  };
};

}  // namespace cb
