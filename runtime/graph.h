// A minimal compute graph.  Model code describes a forward pass as a list of
// ops over 2-D f32 tensors (and KV caches of f32 or f16, see external_kv);
// plan() assigns every intermediate tensor a slot in one reusable arena
// (tensors whose lifetimes do not overlap share memory); execute() runs the
// ops, in order, on a Backend.  The node list is the schedule: there is no
// reordering, so a caller can run a range of nodes (one layer) and do other
// work in between (the CacheBlend pipeline does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"

namespace cb {

using TensorId = int32_t;

// Asked before every op of a run; true stops it with Error(kCancelled).  The
// caller's way to cancel a long prefill within one op's time.
using StopCheck = std::function<bool()>;

class Graph {
 public:
  // A tensor whose memory the caller owns (inputs, outputs, KV caches).
  TensorId external(float* data, int64_t rows, int64_t cols);
  // A KV cache whose elements are `type` (F32 or F16, AttentionArgs::kv_type).
  // An F16 tensor is only the destination of scatter_rows (rows rounded to
  // f16 on the way in) and the k / v of attention (read in place); any
  // other op on it is an error.
  TensorId external_kv(void* data, int64_t rows, int64_t cols, DType type);

  // Each op returns its output tensor (placed in the arena) unless noted.
  TensorId get_rows(const WeightView& w, const int32_t* ids, int64_t n);
  // Precision::kInt8Activations runs Backend::matmul_q8 (decode's int8
  // GEMV); the default keeps f32 activations (Backend::matmul).
  enum class Precision : uint8_t { kF32, kInt8Activations };
  TensorId matmul(const WeightView& w, TensorId x, Precision p = Precision::kF32);
  void matmul_into(const WeightView& w, TensorId x, TensorId out, Precision p = Precision::kF32);
  // dst += W x as one op (Backend::product accumulating): a residual
  // branch's output projection.
  void matmul_add_into(const WeightView& w, TensorId x, TensorId dst,
                       Precision p = Precision::kF32);
  // W (act(gate) * up) as one op (Backend::product with a gate): a gated
  // feed-forward's down projection.  gate may be overwritten with
  // act(gate) * up (in place: the FFN's widest tensors are the gate and up
  // projections, and a third one would hold a batch's worth more, 16 MiB
  // for 512 rows of a Llama 3.2 1B).  Added into add_into when given, else
  // written to a new tensor, which is returned (add_into is returned
  // otherwise).
  TensorId matmul_gated(const WeightView& w, TensorId gate, TensorId up, ProductArgs::Gate act,
                        Precision p = Precision::kF32, TensorId add_into = -1);
  TensorId rmsnorm(TensorId x, const float* weight, float eps);
  // rmsnorm of every `group` consecutive floats of x (one head of a row: the
  // Q/K norms of qwen3), weight of `group` floats, into `out` (x's shape;
  // not x) when given, else into a new tensor.
  TensorId rmsnorm_groups(TensorId x, const float* weight, int64_t group, float eps,
                          TensorId out = -1);
  // In place on x (n_heads heads of head_dim per row); freq_factors as
  // Backend::rope's (may be null).
  void rope(TensorId x, const int32_t* pos, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
            float freq_base, const float* freq_factors);
  // Queries x positions over the first n_kv rows of k / v, each seeing the
  // last `window` keys up to its own when window > 0, their logits biased
  // by key_bias (see AttentionArgs).
  TensorId attention(TensorId q, const int32_t* q_pos, TensorId k, TensorId v, int64_t n_kv,
                     int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                     int64_t window = 0, const KeyBlockBias& key_bias = {});
  // Every attention node reads the first n_kv rows of its K / V from now
  // on, biased by key_bias: a graph built once for one decode token serves
  // the next ones (its positions and token read through stable pointers).
  void set_attention_context(int64_t n_kv, const KeyBlockBias& key_bias);
  void scale(TensorId x, float s);               // x *= s, in place
  void add_into(TensorId dst, TensorId src);     // dst += src
  void add_bias(TensorId x, const float* bias);  // every row of x += bias (cols floats)
  TensorId gather_rows(TensorId src, const int32_t* idx, int64_t n);
  // dst[idx[r]] = src[r]; into an F16 dst, rounded (Backend::scatter_rows_f16).
  void scatter_rows(TensorId src, const int32_t* idx, TensorId dst);

  // Assigns arena offsets; returns the arena size in bytes.  Call once after
  // the last op is added.
  size_t plan();
  // Runs nodes [begin, end) with arena memory from plan(), as one backend
  // batch (Backend::begin_batch): a GPU backend may still be running the
  // ops until it returns, so external tensors in backend memory (the KV
  // cache, the fusor's activations) are for the host to touch only before
  // the call or after it.  `stop` (may be null) is asked before each op
  // (consecutive products of one input count as one).
  void execute(Backend& be, void* arena, size_t begin = 0, size_t end = SIZE_MAX,
               const StopCheck* stop = nullptr) const;
  // Runs every node as one batch that the backend may record under `key`
  // and replay (Backend::begin_replay) instead of the ops being issued
  // again: the caller keeps the arena, the external tensors and the
  // attention context that `key` was first run with, or forgets the key.
  void execute_replayable(Backend& be, void* arena, uint64_t key) const;

  size_t n_nodes() const { return nodes_.size(); }
  int64_t rows(TensorId t) const { return tensors_[t].rows; }
  int64_t cols(TensorId t) const { return tensors_[t].cols; }

 private:
  enum class Op : uint8_t {
    kGetRows,
    kMatMul,
    kRmsNorm,
    kRmsNormGroups,
    kRope,
    kAttention,
    kScale,
    kAdd,
    kAddBias,
    kGatherRows,
    kScatterRows,
    kScatterRowsF16
  };
  struct Tensor {
    int64_t rows = 0, cols = 0;
    DType type = DType::F32;
    void* external = nullptr;
    size_t offset = 0;
    int32_t first = -1, last = -1;  // node indices that produce / last touch it
  };
  struct Node {
    Op op;
    TensorId out = -1, a = -1, b = -1, c = -1;
    const WeightView* weight = nullptr;
    const float* vec = nullptr;
    const int32_t* ints = nullptr;
    int64_t p[5] = {0, 0, 0, 0, 0};
    float f = 0.0f;
    KeyBlockBias key_bias;  // kAttention
  };

  TensorId new_tensor(int64_t rows, int64_t cols);
  Node& push(Op op, TensorId out, TensorId a = -1, TensorId b = -1, TensorId c = -1);
  // A kMatMul node: out (=|+=) W act(x [* up]).  p[0]: int8 activations,
  // p[1]: the gate (ProductArgs::Gate), p[2]: accumulate into out, with
  // scratch c for Backend::product's default.
  void push_product(const WeightView& w, TensorId x, TensorId up, ProductArgs::Gate act,
                    Precision p, TensorId out, bool accumulate);
  float* ptr(TensorId t, void* arena) const;  // an F32 tensor's floats
  void* raw(TensorId t, void* arena) const;   // any tensor's elements
  void run_node(Backend& be, const Node& n, void* arena) const;
  // Nodes [begin, end), consecutive plain products of one input handed to
  // Backend::products together.
  void run_nodes(Backend& be, void* arena, size_t begin, size_t end, const StopCheck* stop) const;
  // How many nodes from i (at most kMaxProductRun, before end) are plain
  // products (no gate, no accumulation) of node i's input with distinct
  // outputs; 1 where node i is not one.
  static constexpr size_t kMaxProductRun = 4;
  size_t product_run(size_t i, size_t end) const;
  ProductArgs product_args(const Node& n, void* arena) const;  // a kMatMul node's

  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  // WeightViews are copied in so callers may pass temporaries.
  std::vector<std::unique_ptr<WeightView>> weights_;
};

}  // namespace cb
