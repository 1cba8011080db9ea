#include "runtime/session.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_backend.h"
#include "platform/error.h"
#include "runtime/graph.h"
#include "runtime/llama_layer.h"

namespace cb {

BackendKind resolve_backend(BackendRequest request, int device) {
  switch (request) {
    case BackendRequest::kCpu:
      return BackendKind::kCpu;
    case BackendRequest::kAuto:
      return device >= 0 && device < cuda_device_count() ? BackendKind::kCuda : BackendKind::kCpu;
    case BackendRequest::kCuda:
      break;
  }
  if (std::string why; !cuda_plugin_available(&why))
    fail(ErrorCode::kUnsupported, "the CUDA backend is not available: " + why);
  const int n = cuda_device_count();
  if (n == 0)
    fail(ErrorCode::kUnsupported, "no CUDA device is usable by this process (no GPU or no driver)");
  if (device < 0 || device >= n)
    fail(ErrorCode::kUnsupported, "CUDA device " + std::to_string(device) + " does not exist (" +
                                      std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") +
                                      " usable)");
  return BackendKind::kCuda;
}

DType kv_dtype(KvType t) {
  switch (t) {
    case KvType::kF16:
      return DType::F16;
    case KvType::kF32:
      return DType::F32;
  }
  fail(ErrorCode::kInvalidArgument, "unknown KV cache type");
}

const char* kv_type_name(KvType t) {
  return t == KvType::kF16 ? "f16" : t == KvType::kF32 ? "f32" : "unknown";
}

namespace {

std::unique_ptr<Backend> make_backend(const SessionOptions& opts) {
  switch (opts.backend) {
    case BackendKind::kCpu:
      return make_cpu_backend(opts.n_threads, opts.kernels);
    case BackendKind::kCuda:
      return make_cuda_backend(opts.device);
  }
  // Reached only by a value cast into the enum from outside its range.
  fail(ErrorCode::kInvalidArgument, "unknown backend kind");
}

// Keys of decode recordings (Backend::begin_replay), unique in the process
// so that sessions sharing a backend never name each other's.
std::atomic<uint64_t> next_replay_key{0};

}  // namespace

Session::Session(const Model& model, const SessionOptions& opts)
    : Session(model, opts, make_backend(opts)) {}

Session::Session(const Model& model, const SessionOptions& opts, std::unique_ptr<Backend> backend)
    : model_(model), backend_(std::move(backend)) {
  if (!backend_) fail(ErrorCode::kInvalidArgument, "session without a backend");
  const LlamaHparams& hp = model.hparams();
  n_ctx_ = opts.n_ctx > 0 ? opts.n_ctx : std::min<int64_t>(hp.n_ctx_train, 4096);
  if (opts.n_ctx < 0 || n_ctx_ > hp.n_ctx_train)
    fail(ErrorCode::kInvalidArgument, "context size " + std::to_string(opts.n_ctx) +
                                          " is outside 1.." + std::to_string(hp.n_ctx_train) +
                                          " (the model's training context)");
  if (opts.n_batch < 0) fail(ErrorCode::kInvalidArgument, "batch size must be >= 0 (0: default)");
  if (opts.resident_kv_bytes < -1)
    fail(ErrorCode::kInvalidArgument,
         "resident_kv_bytes must be >= -1 (-1: the backend's choice, 0: none)");
  n_batch_ = std::min(opts.n_batch > 0 ? opts.n_batch : backend_->default_batch_rows(), n_ctx_);
  int8_decode_ = opts.int8_decode;
  int8_prefill_ = opts.int8_prefill;
  const size_t elem = dtype_block_bytes(cb::kv_dtype(opts.kv_type));  // throws for a bad value
  kv_type_ = opts.kv_type;

  // The norm weights and biases go to the backend too, as the interface
  // asks: a GPU backend then finds them among its own blocks, where a host
  // pointer would cost it a driver query, a comparison with its mirror and
  // perhaps an upload at every op.
  auto prepare_vector = [&](const float*& v, int64_t n) {
    if (v != nullptr)
      v = static_cast<const float*>(backend_->prepare_weight({v, DType::F32, n, 1}).data);
  };
  for (const LayerWeights& w : model.layers()) {
    LayerWeights p = w;
    for (WeightView* v : {&p.wq, &p.wk, &p.wv, &p.wo, &p.w_gate, &p.w_up, &p.w_down})
      *v = backend_->prepare_weight(*v);
    for (const float** v : {&p.attn_norm, &p.ffn_norm, &p.attn_post_norm, &p.ffn_post_norm})
      prepare_vector(*v, hp.n_embd);
    prepare_vector(p.bq, hp.n_head * hp.head_dim);
    prepare_vector(p.bk, hp.kv_dim());
    prepare_vector(p.bv, hp.kv_dim());
    prepare_vector(p.q_norm, hp.head_dim);
    prepare_vector(p.k_norm, hp.head_dim);
    prepare_vector(p.rope_factors, hp.rot_dim / 2);
    layers_.push_back(p);
  }
  tok_embd_ = backend_->prepare_weight(model.token_embd());
  output_ = backend_->prepare_weight(model.output());
  output_norm_ = model.output_norm();
  prepare_vector(output_norm_, hp.n_embd);

  const size_t kv_bytes = static_cast<size_t>(n_ctx_ * hp.kv_dim()) * elem;
  try {
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      k_cache_.push_back(backend_->alloc_buffer(kv_bytes));
      v_cache_.push_back(backend_->alloc_buffer(kv_bytes));
    }
  } catch (...) {
    for (void* p : k_cache_) backend_->free_buffer(p);
    for (void* p : v_cache_) backend_->free_buffer(p);
    throw;
  }
  kv_bytes_ = 2 * kv_bytes * static_cast<size_t>(hp.n_layer);
  logits_.resize(static_cast<size_t>(hp.n_vocab));
  const uint64_t resident = !backend_->wants_staged_uploads() ? 0
                            : opts.resident_kv_bytes < 0
                                ? backend_->resident_kv_bytes()
                                : static_cast<uint64_t>(opts.resident_kv_bytes);
  resident_ = std::make_unique<ResidentChunks>(*backend_, hp.n_layer, hp.kv_dim(), elem, resident);
}

Session::~Session() {
  forget_decode_key();
  resident_.reset();
  for (void* p : k_cache_) backend_->free_buffer(p);
  for (void* p : v_cache_) backend_->free_buffer(p);
  if (arena_) backend_->free_buffer(arena_);
  if (decode_in_) backend_->free_buffer(decode_in_);
}

void Session::read_kv_rows(int64_t layer, bool v, int64_t first, int64_t n, float* out) {
  if (layer < 0 || layer >= model_.hparams().n_layer || first < 0 || n < 0 || first + n > n_ctx_)
    fail(ErrorCode::kInvalidArgument, "KV rows outside the cache");
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), static_cast<int32_t>(first));
  load_kv_rows(*backend_, kv_dtype(), v ? v_cache_[layer] : k_cache_[layer],
               model_.hparams().kv_dim(), idx.data(), n, out);
}

void Session::set_n_past(int64_t n) {
  if (n < 0 || n > n_ctx_) fail(ErrorCode::kInvalidArgument, "session length outside the context");
  n_past_ = n;
}

void Session::truncate(int64_t n) {
  if (n < 0 || n > n_past_) fail(ErrorCode::kInvalidArgument, "truncate beyond the session length");
  n_past_ = n;
  if (n < context_bias_.key_end) context_bias_ = {};
}

void Session::check_tokens(std::span<const int32_t> tokens) const {
  if (tokens.empty()) fail(ErrorCode::kInvalidArgument, "no tokens to process");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n > n_ctx_ - n_past_)
    fail(ErrorCode::kContextOverflow,
         "prompt of " + std::to_string(n) + " tokens does not fit: " + std::to_string(n_past_) +
             " of " + std::to_string(n_ctx_) + " context positions are used");
  const int64_t n_vocab = model_.hparams().n_vocab;
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab)
      fail(ErrorCode::kInvalidArgument,
           "token id " + std::to_string(t) + " is outside 0.." + std::to_string(n_vocab - 1));
}

std::span<const float> Session::prefill(std::span<const int32_t> tokens) {
  check_tokens(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t before = n_past_;
  try {
    for (int64_t i = 0; i < n; i += n_batch_) {
      const int64_t b = std::min(n_batch_, n - i);
      forward_batch(tokens.data() + i, b, prefill_precision(), stop_check());
      report_progress(ProgressStage::kPrefill, i + b, n);
    }
  } catch (...) {
    n_past_ = before;  // the rows written past it are never read
    throw;
  }
  return logits_;
}

std::span<const float> Session::decode(int32_t token) {
  check_tokens({&token, 1});
  forget_stale_context_bias();
  // One graph serves every token: built at the first, it reads the token
  // and its position through these members, and only the attention's
  // length and bias change between tokens.  A GPU backend then sees the
  // same ops on the same buffers at every token, and the host is spared
  // building and planning ~500 nodes a token.
  if (!decode_graph_) {
    if (!decode_in_)
      decode_in_ = static_cast<int32_t*>(backend_->alloc_buffer(sizeof decode_in_host_));
    auto g = std::make_unique<Graph>();
    add_forward(*g, &decode_in_[0], &decode_in_[1], nullptr, 1, 1,
                int8_decode_ ? Graph::Precision::kInt8Activations : Graph::Precision::kF32,
                nullptr);
    decode_arena_bytes_ = g->plan();
    decode_graph_ = std::move(g);
  }
  ensure_arena(decode_arena_bytes_);
  // Every token's ops, arguments included, are then the same, so a backend
  // may replay a recording of them (a GPU: one launch for ~500 kernels):
  // the attention takes the whole cache, and its causal bound (the key
  // rows up to the token's position, which it reads in backend memory)
  // keeps it to the rows written.
  if (decode_key_ == 0 || !(decode_key_bias_ == context_bias_)) {
    forget_decode_key();
    decode_graph_->set_attention_context(n_ctx_, context_bias_);
    decode_key_bias_ = context_bias_;
    decode_key_ = next_replay_key.fetch_add(1) + 1;
  }
  // Uploaded rather than written in place: a GPU then copies 8 bytes ahead
  // of the token's ops, where a host write to managed memory would move
  // the page to the host and back, and host-memory arguments would cost a
  // look-up per op.
  decode_in_host_[0] = token;
  decode_in_host_[1] = static_cast<int32_t>(n_past_);
  backend_->upload(decode_in_, decode_in_host_, sizeof decode_in_host_);
  decode_graph_->execute_replayable(*backend_, arena_, decode_key_);
  ++n_past_;
  return logits_;
}

void Session::forget_decode_key() {
  if (decode_key_ != 0) backend_->forget_replay(decode_key_);
  decode_key_ = 0;
}

std::vector<float> Session::embed(std::span<const int32_t> tokens) {
  n_past_ = 0;
  check_tokens(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size()), d = model_.hparams().n_embd;
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  std::vector<float> rows;
  struct Empty {  // the session is empty afterwards, also when this throws
    int64_t& n_past;
    ~Empty() { n_past = 0; }
  } empty{n_past_};
  for (int64_t i = 0; i < n; i += n_batch_) {
    const int64_t b = std::min(n_batch_, n - i);
    rows.resize(static_cast<size_t>(b * d));
    forward_batch(tokens.data() + i, b, prefill_precision(), stop_check(), rows.data());
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = 0; j < d; ++j)
        sum[static_cast<size_t>(j)] += rows[static_cast<size_t>(r * d + j)];
    report_progress(ProgressStage::kPrefill, i + b, n);
  }
  double norm = 0.0;
  for (double v : sum) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(static_cast<size_t>(d), 0.0f);
  if (norm > 0.0)
    for (int64_t j = 0; j < d; ++j)
      out[static_cast<size_t>(j)] = static_cast<float>(sum[static_cast<size_t>(j)] / norm);
  return out;
}

void Session::forget_stale_context_bias() {
  if (n_past_ < context_bias_.key_end) context_bias_ = {};
}

// One forward pass over n tokens at positions n_past_.. ; writes their K/V
// into the cache and the last token's logits into logits_ (or every row's
// normed hidden state into `hidden`).
void Session::forward_batch(const int32_t* tokens, int64_t n, Graph::Precision mm,
                            const StopCheck* stop, float* hidden) {
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(n_past_));
  const int32_t last_row = static_cast<int32_t>(n - 1);
  forget_stale_context_bias();
  Graph g;
  add_forward(g, tokens, pos.data(), &last_row, n, n_past_ + n, mm, hidden);
  execute(g, g.plan(), stop);
  n_past_ += n;
}

void Session::add_forward(Graph& g, const int32_t* tokens, const int32_t* pos,
                          const int32_t* last_row, int64_t n, int64_t n_kv, Graph::Precision mm,
                          float* hidden) {
  const LlamaHparams& hp = model_.hparams();
  TensorId x = add_embeddings(g, hp, tok_embd_, tokens, n);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    LlamaLayer layer(g, hp, layers_[static_cast<size_t>(l)], l, mm);
    TensorId h = layer.attention_input(x);
    // Past the last layer only the last row is read (the logits): there
    // every row's K/V go into the cache, but only that row attends and
    // runs the FFN.  Elsewhere the three projections of h are consecutive
    // nodes, which a backend may run as one launch (Backend::products).
    const bool last_row_only = l + 1 == hp.n_layer && n > 1 && hidden == nullptr;
    TensorId q = last_row_only ? -1 : layer.project_q(h);
    TensorId k = layer.project_k(h);
    TensorId v = layer.project_v(h);
    layer.rope_k(k, pos);
    TensorId kc = g.external_kv(k_cache_[l], n_ctx_, hp.kv_dim(), kv_dtype());
    TensorId vc = g.external_kv(v_cache_[l], n_ctx_, hp.kv_dim(), kv_dtype());
    g.scatter_rows(k, pos, kc);
    g.scatter_rows(v, pos, vc);
    const int32_t* q_pos = pos;
    if (last_row_only) {
      h = g.gather_rows(h, last_row, 1);
      x = g.gather_rows(x, last_row, 1);
      q_pos += *last_row;
      q = layer.project_q(h);
    }
    layer.rope_q(q, q_pos);
    layer.attention_output(x, layer.attention(q, q_pos, kc, vc, n_kv, context_bias_));
    layer.ffn(x);
  }
  if (hidden != nullptr) {
    g.rmsnorm_groups(x, output_norm_, hp.n_embd, hp.rms_eps, g.external(hidden, n, hp.n_embd));
  } else {
    // x is the last row alone now.
    add_output_head(g, hp, output_norm_, output_, x, g.external(logits_.data(), 1, hp.n_vocab), mm);
  }
}

void Session::ensure_arena(size_t bytes) {
  if (bytes <= arena_bytes_) return;
  forget_decode_key();  // its recording names the old arena
  if (arena_) backend_->free_buffer(arena_);
  arena_ = nullptr;
  arena_bytes_ = 0;  // also when the allocation below fails
  arena_ = backend_->alloc_buffer(bytes);
  arena_bytes_ = bytes;
}

void Session::execute(const Graph& g, size_t arena_bytes, const StopCheck* stop) {
  ensure_arena(arena_bytes);
  g.execute(*backend_, arena_, 0, SIZE_MAX, stop);
}

}  // namespace cb
