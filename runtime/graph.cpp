#include "runtime/graph.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "platform/error.h"

namespace cb {
namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

TensorId Graph::new_tensor(int64_t rows, int64_t cols) {
  Tensor t;
  t.rows = rows;
  t.cols = cols;
  tensors_.push_back(t);
  return static_cast<TensorId>(tensors_.size() - 1);
}

TensorId Graph::external(float* data, int64_t rows, int64_t cols) {
  TensorId id = new_tensor(rows, cols);
  tensors_[id].external = data;
  return id;
}

TensorId Graph::external_kv(void* data, int64_t rows, int64_t cols, DType type) {
  if (type != DType::F32 && type != DType::F16)
    fail(ErrorCode::kInternal, "graph: a KV cache is F32 or F16");
  TensorId id = new_tensor(rows, cols);
  tensors_[id].external = data;
  tensors_[id].type = type;
  return id;
}

Graph::Node& Graph::push(Op op, TensorId out, TensorId a, TensorId b, TensorId c) {
  // F16 tensors are KV caches: the destination of a scatter, the K / V of
  // attention, nothing else.
  auto is_f32 = [&](TensorId t) { return t < 0 || tensors_[t].type == DType::F32; };
  const bool ok = op == Op::kAttention        ? is_f32(out) && is_f32(a)
                  : op == Op::kScatterRowsF16 ? tensors_[out].type == DType::F16 && is_f32(a)
                                              : is_f32(out) && is_f32(a) && is_f32(b) && is_f32(c);
  if (!ok) fail(ErrorCode::kInternal, "graph: an f16 tensor given to an op that takes f32");
  int32_t idx = static_cast<int32_t>(nodes_.size());
  for (TensorId t : {out, a, b, c}) {
    if (t < 0) continue;
    Tensor& ten = tensors_[t];
    if (ten.first < 0) ten.first = idx;
    ten.last = idx;
  }
  Node n;
  n.op = op;
  n.out = out;
  n.a = a;
  n.b = b;
  n.c = c;
  nodes_.push_back(n);
  return nodes_.back();
}

TensorId Graph::get_rows(const WeightView& w, const int32_t* ids, int64_t n) {
  TensorId out = new_tensor(n, w.n_in);
  weights_.push_back(std::make_unique<WeightView>(w));
  Node& node = push(Op::kGetRows, out);
  node.weight = weights_.back().get();
  node.ints = ids;
  return out;
}

void Graph::push_product(const WeightView& w, TensorId x, TensorId up, ProductArgs::Gate act,
                         Precision p, TensorId out, bool accumulate) {
  const Tensor& tx = tensors_[x];
  if (tx.cols != w.n_in || tensors_[out].cols != w.n_out || tensors_[out].rows != tx.rows ||
      (up >= 0 && (tensors_[up].rows != tx.rows || tensors_[up].cols != tx.cols)))
    fail(ErrorCode::kInternal, "graph: matmul shape mismatch");
  if (out == x || out == up) fail(ErrorCode::kInternal, "graph: a product's output is its input");
  const TensorId scratch = accumulate ? new_tensor(tx.rows, w.n_out) : -1;
  weights_.push_back(std::make_unique<WeightView>(w));
  Node& n = push(Op::kMatMul, out, x, up, scratch);
  n.weight = weights_.back().get();
  n.p[0] = p == Precision::kInt8Activations ? 1 : 0;
  n.p[1] = static_cast<int64_t>(act);
  n.p[2] = accumulate ? 1 : 0;
}

void Graph::matmul_into(const WeightView& w, TensorId x, TensorId out, Precision p) {
  push_product(w, x, -1, ProductArgs::Gate::kNone, p, out, false);
}

void Graph::matmul_add_into(const WeightView& w, TensorId x, TensorId dst, Precision p) {
  push_product(w, x, -1, ProductArgs::Gate::kNone, p, dst, true);
}

TensorId Graph::matmul_gated(const WeightView& w, TensorId gate, TensorId up, ProductArgs::Gate act,
                             Precision p, TensorId add_into) {
  if (act == ProductArgs::Gate::kNone) fail(ErrorCode::kInternal, "graph: a gated product's gate");
  const TensorId out = add_into >= 0 ? add_into : new_tensor(tensors_[gate].rows, w.n_out);
  push_product(w, gate, up, act, p, out, add_into >= 0);
  return out;
}

TensorId Graph::matmul(const WeightView& w, TensorId x, Precision p) {
  TensorId out = new_tensor(tensors_[x].rows, w.n_out);
  matmul_into(w, x, out, p);
  return out;
}

TensorId Graph::rmsnorm(TensorId x, const float* weight, float eps) {
  TensorId out = new_tensor(tensors_[x].rows, tensors_[x].cols);
  Node& n = push(Op::kRmsNorm, out, x);
  n.vec = weight;
  n.f = eps;
  return out;
}

TensorId Graph::rmsnorm_groups(TensorId x, const float* weight, int64_t group, float eps,
                               TensorId out) {
  if (group <= 0 || tensors_[x].cols % group != 0)
    fail(ErrorCode::kInternal, "graph: rmsnorm groups do not divide the row");
  if (out < 0) out = new_tensor(tensors_[x].rows, tensors_[x].cols);
  if (out == x || tensors_[out].rows != tensors_[x].rows || tensors_[out].cols != tensors_[x].cols)
    fail(ErrorCode::kInternal, "graph: rmsnorm groups output shape");
  Node& n = push(Op::kRmsNormGroups, out, x);
  n.vec = weight;
  n.f = eps;
  n.p[0] = group;
  return out;
}

void Graph::rope(TensorId x, const int32_t* pos, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
                 float freq_base, const float* freq_factors) {
  if (tensors_[x].cols != n_heads * head_dim) fail(ErrorCode::kInternal, "graph: rope shape");
  Node& n = push(Op::kRope, x);
  n.ints = pos;
  n.p[0] = n_heads;
  n.p[1] = head_dim;
  n.p[2] = rot_dim;
  n.f = freq_base;
  n.vec = freq_factors;
}

TensorId Graph::attention(TensorId q, const int32_t* q_pos, TensorId k, TensorId v, int64_t n_kv,
                          int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                          int64_t window, const KeyBlockBias& key_bias) {
  if (n_kv > tensors_[k].rows || n_kv > tensors_[v].rows)
    fail(ErrorCode::kInternal, "graph: attention over more rows than the cache holds");
  if (tensors_[k].type != tensors_[v].type)
    fail(ErrorCode::kInternal, "graph: attention over K and V of different types");
  TensorId out = new_tensor(tensors_[q].rows, n_head * head_dim);
  Node& n = push(Op::kAttention, out, q, k, v);
  n.ints = q_pos;
  n.p[0] = n_kv;
  n.p[1] = n_head;
  n.p[2] = n_head_kv;
  n.p[3] = head_dim;
  n.p[4] = window;
  n.f = scale;
  n.key_bias = key_bias;
  return out;
}

void Graph::set_attention_context(int64_t n_kv, const KeyBlockBias& key_bias) {
  for (Node& n : nodes_) {
    if (n.op != Op::kAttention) continue;
    if (n_kv < 0 || n_kv > tensors_[n.b].rows || n_kv > tensors_[n.c].rows)
      fail(ErrorCode::kInternal, "graph: attention over more rows than the cache holds");
    n.p[0] = n_kv;
    n.key_bias = key_bias;
  }
}

void Graph::scale(TensorId x, float s) {
  push(Op::kScale, x).f = s;
}

void Graph::add_into(TensorId dst, TensorId src) {
  if (tensors_[dst].rows != tensors_[src].rows || tensors_[dst].cols != tensors_[src].cols)
    fail(ErrorCode::kInternal, "graph: add shape mismatch");
  push(Op::kAdd, dst, src);
}

void Graph::add_bias(TensorId x, const float* bias) {
  // Straight after the product that wrote x it joins that node
  // (Backend::matmul_bias: the same bits, one op less).
  if (!nodes_.empty()) {
    Node& last = nodes_.back();
    if (last.op == Op::kMatMul && last.out == x && last.vec == nullptr && last.p[2] == 0) {
      last.vec = bias;
      return;
    }
  }
  push(Op::kAddBias, x).vec = bias;
}

TensorId Graph::gather_rows(TensorId src, const int32_t* idx, int64_t n) {
  TensorId out = new_tensor(n, tensors_[src].cols);
  push(Op::kGatherRows, out, src).ints = idx;
  return out;
}

void Graph::scatter_rows(TensorId src, const int32_t* idx, TensorId dst) {
  if (tensors_[src].cols != tensors_[dst].cols) fail(ErrorCode::kInternal, "graph: scatter shape");
  push(tensors_[dst].type == DType::F16 ? Op::kScatterRowsF16 : Op::kScatterRows, dst, src).ints =
      idx;
}

size_t Graph::plan() {
  // First-fit by production order.  A tensor may reuse memory of tensors whose
  // last use is strictly before its first node (a node's inputs and outputs
  // never overlap).
  struct Live {
    size_t offset, size;
    int32_t last;
  };
  std::vector<Live> live;
  std::vector<TensorId> order;
  for (TensorId t = 0; t < static_cast<TensorId>(tensors_.size()); ++t)
    if (!tensors_[t].external && tensors_[t].first >= 0) order.push_back(t);
  std::stable_sort(order.begin(), order.end(),
                   [&](TensorId a, TensorId b) { return tensors_[a].first < tensors_[b].first; });
  size_t arena = 0;
  for (TensorId id : order) {
    Tensor& t = tensors_[id];
    std::erase_if(live, [&](const Live& l) { return l.last < t.first; });
    std::sort(live.begin(), live.end(),
              [](const Live& a, const Live& b) { return a.offset < b.offset; });
    size_t size = align_up(static_cast<size_t>(t.rows * t.cols) * sizeof(float));
    size_t off = 0;
    for (const Live& l : live) {
      if (off + size <= l.offset) break;
      off = std::max(off, l.offset + l.size);
    }
    t.offset = off;
    live.push_back({off, size, t.last});
    arena = std::max(arena, off + size);
  }
  return arena;
}

void* Graph::raw(TensorId t, void* arena) const {
  if (t < 0) return nullptr;
  const Tensor& ten = tensors_[t];
  return ten.external ? ten.external : static_cast<char*>(arena) + ten.offset;
}

float* Graph::ptr(TensorId t, void* arena) const {
  return static_cast<float*>(raw(t, arena));
}

void Graph::execute(Backend& be, void* arena, size_t begin, size_t end,
                    const StopCheck* stop) const {
  end = std::min(end, nodes_.size());
  // One batch for the range: a GPU backend then waits once for all its ops
  // (a decode token is one synchronisation, not one per op).
  run_batch(be, [&] { run_nodes(be, arena, begin, end, stop); });
}

size_t Graph::product_run(size_t i, size_t end) const {
  auto plain = [&](const Node& n) { return n.op == Op::kMatMul && n.p[1] == 0 && n.p[2] == 0; };
  if (!plain(nodes_[i])) return 1;
  size_t j = i + 1;
  for (; j < end && j - i < kMaxProductRun; ++j) {
    if (!plain(nodes_[j]) || nodes_[j].a != nodes_[i].a) break;
    bool distinct = true;
    for (size_t k = i; k < j; ++k) distinct = distinct && nodes_[k].out != nodes_[j].out;
    if (!distinct) break;
  }
  return j - i;
}

void Graph::run_nodes(Backend& be, void* arena, size_t begin, size_t end,
                      const StopCheck* stop) const {
  for (size_t i = begin; i < end;) {
    if (stop != nullptr && (*stop)())
      fail(ErrorCode::kCancelled, "cancelled at the caller's request");
    const size_t n = product_run(i, end);
    if (n == 1) {
      run_node(be, nodes_[i], arena);
    } else {
      std::array<ProductArgs, kMaxProductRun> args;
      for (size_t k = 0; k < n; ++k) args[k] = product_args(nodes_[i + k], arena);
      be.products(args.data(), static_cast<int64_t>(n));
    }
    i += n;
  }
}

ProductArgs Graph::product_args(const Node& n, void* arena) const {
  ProductArgs args;
  args.w = n.weight;
  args.x = ptr(n.a, arena);
  args.up = ptr(n.b, arena);
  args.gate = static_cast<ProductArgs::Gate>(n.p[1]);
  args.n_rows = tensors_[n.out].rows;
  args.bias = n.vec;
  args.q8 = n.p[0] != 0;
  args.accumulate = n.p[2] != 0;
  args.scratch = ptr(n.c, arena);
  args.y = ptr(n.out, arena);
  return args;
}

void Graph::execute_replayable(Backend& be, void* arena, uint64_t key) const {
  const Backend::ReplayStart start = be.begin_replay(key);
  try {
    end_batch_after(be, [&] {
      if (start != Backend::ReplayStart::kReplayed) run_nodes(be, arena, 0, nodes_.size(), nullptr);
    });
  } catch (const Error& e) {
    // A recording that failed ran nothing: the ops once more, as usual (an
    // error of their own comes back from there).
    if (start != Backend::ReplayStart::kRecord || e.code() != ErrorCode::kUnsupported) throw;
    execute(be, arena);
  }
}

void Graph::run_node(Backend& be, const Node& n, void* arena) const {
  float* out = ptr(n.out, arena);
  const float* a = ptr(n.a, arena);
  const Tensor& to = tensors_[n.out];
  switch (n.op) {
    case Op::kGetRows:
      be.get_rows(*n.weight, n.ints, to.rows, out);
      break;
    case Op::kMatMul:
      if (n.p[1] != 0 || n.p[2] != 0) {
        be.product(product_args(n, arena));
      } else if (n.vec != nullptr) {
        be.matmul_bias(*n.weight, a, to.rows, n.vec, out, n.p[0] != 0);
      } else if (n.p[0] != 0) {
        be.matmul_q8(*n.weight, a, to.rows, out);
      } else {
        be.matmul(*n.weight, a, to.rows, out);
      }
      break;
    case Op::kRmsNorm:
      be.rmsnorm(a, n.vec, to.rows, to.cols, n.f, out);
      break;
    case Op::kRmsNormGroups:
      be.rmsnorm(a, n.vec, to.rows * to.cols / n.p[0], n.p[0], n.f, out);
      break;
    case Op::kRope:
      be.rope(out, n.ints, to.rows, n.p[0], n.p[1], n.p[2], n.f, n.vec);
      break;
    case Op::kAttention: {
      AttentionArgs args;
      args.q = a;
      args.q_pos = n.ints;
      args.n_q = to.rows;
      args.k = raw(n.b, arena);
      args.v = raw(n.c, arena);
      args.kv_type = tensors_[n.b].type;
      args.n_kv = n.p[0];
      args.n_head = n.p[1];
      args.n_head_kv = n.p[2];
      args.head_dim = n.p[3];
      args.scale = n.f;
      args.window = n.p[4];
      args.key_bias = n.key_bias;
      args.out = out;
      be.attention(args);
      break;
    }
    case Op::kScale:
      be.scale(out, to.rows * to.cols, n.f);
      break;
    case Op::kAdd:
      be.add(out, a, to.rows * to.cols, out);
      break;
    case Op::kAddBias:
      be.add_bias(out, n.vec, to.rows, to.cols);
      break;
    case Op::kGatherRows:
      be.gather_rows(a, to.cols, n.ints, to.rows, out);
      break;
    case Op::kScatterRows:
      be.scatter_rows(a, to.cols, n.ints, tensors_[n.a].rows, out);
      break;
    case Op::kScatterRowsF16:
      be.scatter_rows_f16(a, to.cols, n.ints, tensors_[n.a].rows,
                          static_cast<uint16_t*>(raw(n.out, arena)));
      break;
  }
}

}  // namespace cb
