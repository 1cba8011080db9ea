// The fused prefill.  Each layer runs in two steps over the rows R carried at
// that layer (global positions, ascending):
//   1. norm and Q/K/V projections of R;
//   2. RoPE, K/V written to the cache at R's positions, attention of R's
//      queries over all n keys (causal by global position), output
//      projection and FFN of R.
// Before step 1 every cached chunk's KV of the layer is in the cache (K
// rotated to its global position), so rows outside R attend and are attended
// with their cached KV; the layer pipeline loads it, ahead of time when it
// runs on its own thread.  At a check layer, between the steps, the
// fresh V of R's reused rows is compared with the cached V, and R narrows to
// the most deviating ones plus every uncached row.
#include "runtime/blend/fusor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>

#include "platform/error.h"
#include "runtime/blend/layer_pipeline.h"
#include "runtime/graph.h"

namespace cb {

bool MemoryChunkSource::fetch_layer(int64_t layer, float* k, float* v) {
  if (layer < 0 || layer >= kv_.shape.n_layers) return false;
  const size_t n = static_cast<size_t>(kv_.shape.layer_floats());
  std::memcpy(k, kv_.k.data() + layer * n, n * sizeof(float));
  std::memcpy(v, kv_.v.data() + layer * n, n * sizeof(float));
  return true;
}

uint64_t MemoryChunkSource::layer_bytes(int64_t layer) const {
  if (layer < 0 || layer >= kv_.shape.n_layers) return 0;
  return 2 * static_cast<uint64_t>(kv_.shape.layer_floats()) * sizeof(float);
}

double FusionStats::computed_fraction() const {
  if (n_tokens == 0 || rows_per_layer.empty()) return 0.0;
  double rows = std::accumulate(rows_per_layer.begin(), rows_per_layer.end(), 0.0);
  return rows / (static_cast<double>(n_tokens) * static_cast<double>(rows_per_layer.size()));
}

namespace {

// Floats in backend memory (alloc_buffer), so that a GPU backend computes on
// them in place: host vectors would be staged over PCIe at every op.  The
// host touches them only between graphs, outside a batch (the capture copy).
class BackendFloats {
 public:
  explicit BackendFloats(Backend& be) : p_(nullptr, Free{&be}) {}
  float* data() { return static_cast<float*>(p_.get()); }
  // At least n floats.  Growing does not keep the contents: every caller
  // overwrites them.
  void reserve(size_t n) {
    if (n <= capacity_) return;
    p_.reset();  // before the new one: peak memory
    capacity_ = 0;
    p_.reset(p_.get_deleter().be->alloc_buffer(n * sizeof(float)));
    capacity_ = n;
  }

 private:
  struct Free {
    Backend* be;
    void operator()(void* p) const { be->free_buffer(p); }
  };
  std::unique_ptr<void, Free> p_;
  size_t capacity_ = 0;
};

// Rows per batch inside a fused layer, as Session::prefill's default batch:
// a layer's intermediates for 512 rows (~3 MB for the FFN) stay in cache.
constexpr int64_t kRowBatch = 512;

// One fused forward over a request of n tokens in session s.
class FusedForward {
 public:
  FusedForward(Session& s, std::span<const int32_t> tokens)
      : s_(s),
        hp_(s.model().hparams()),
        be_(s.backend()),
        tokens_(tokens),
        n_(static_cast<int64_t>(tokens.size())) {}

  // Rows computed at layer 0 (ascending positions).
  std::vector<int32_t> rows;
  // The cached chunks, in position order.
  std::vector<CachedChunkRef> cached;
  PipelineOptions pipeline;
  std::vector<uint8_t> is_cached;  // per position
  // Check-layer schedule (blend only) and the count the ratios refer to.
  std::vector<CheckLayer> schedule;
  int64_t n_reused = 0;
  // When set, the chunk rows [capture_begin, n) of K before RoPE and of V
  // are copied here for every layer.
  cache::ChunkKV* capture = nullptr;
  int32_t capture_begin = 0;
  std::vector<int64_t> rows_per_layer;
  std::vector<double> layer_ms;  // compute time per layer, load waits excluded
  PipelineLoadStats load_stats;  // after run()

  // Runs all layers; returns false if a cached chunk could not be read (its
  // index is in failed_chunk) so the caller can retry without it.
  bool run(bool want_logits);
  size_t failed_chunk = 0;

 private:
  bool layers(LayerPipeline& loads);
  void project(int64_t layer);              // step 1
  void select(int64_t layer, float ratio);  // check layer
  void attend_and_ffn(int64_t layer);       // step 2
  void run_graph(Graph& g);
  void resize_buffers();

  Session& s_;
  const LlamaHparams& hp_;
  Backend& be_;
  std::span<const int32_t> tokens_;
  int64_t n_;
  // rows.size() x dim each; scratch_ is narrow()'s destination.
  BackendFloats x_{be_}, q_{be_}, k_{be_}, v_{be_}, scratch_{be_};
  BackendFloats old_{be_}, dev_{be_};  // select()'s cached V rows and deviations
  BackendFloats arena_{be_};
};

void FusedForward::run_graph(Graph& g) {
  // One arena for the whole request, grown on demand: a layer's
  // intermediates are dead once its graph has run.
  arena_.reserve((g.plan() + sizeof(float) - 1) / sizeof(float));
  g.execute(be_, arena_.data());
}

void FusedForward::resize_buffers() {
  const size_t r = rows.size();
  q_.reserve(r * static_cast<size_t>(hp_.n_head * hp_.head_dim));
  k_.reserve(r * static_cast<size_t>(hp_.kv_dim()));
  v_.reserve(r * static_cast<size_t>(hp_.kv_dim()));
}

void FusedForward::project(int64_t layer) {
  const LayerWeights& w = s_.layer_weights()[static_cast<size_t>(layer)];
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  // Row batches keep the intermediates cache-sized (rows are independent here).
  for (int64_t r0 = 0; r0 < r; r0 += kRowBatch) {
    const int64_t b = std::min(kRowBatch, r - r0);
    Graph g;
    TensorId x = g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd);
    TensorId h = g.rmsnorm(x, w.attn_norm, hp_.rms_eps);
    g.matmul_into(w.wq, h, g.external(q_.data() + r0 * q_dim, b, q_dim));
    g.matmul_into(w.wk, h, g.external(k_.data() + r0 * kv_dim, b, kv_dim));
    g.matmul_into(w.wv, h, g.external(v_.data() + r0 * kv_dim, b, kv_dim));
    run_graph(g);
  }
  if (capture) {
    // Rows are all positions here (capture runs a plain prefill); keep the
    // chunk's part, K still un-rotated.  The graphs have run to completion,
    // so the host may read the backend buffers.
    const size_t off = static_cast<size_t>(capture_begin * kv_dim);
    const size_t len = static_cast<size_t>((n_ - capture_begin) * kv_dim);
    std::memcpy(capture->k_layer(static_cast<int>(layer)), k_.data() + off, len * sizeof(float));
    std::memcpy(capture->v_layer(static_cast<int>(layer)), v_.data() + off, len * sizeof(float));
  }
}

void FusedForward::select(int64_t layer, float ratio) {
  const int64_t kv_dim = hp_.kv_dim();
  // Candidates: the reused rows still carried.  The last position is always
  // kept: its logits are the request's output.
  std::vector<int32_t> cand;  // indices into rows
  for (size_t i = 0; i < rows.size(); ++i)
    if (is_cached[rows[i]] && rows[i] != n_ - 1) cand.push_back(static_cast<int32_t>(i));
  const int64_t k = std::min<int64_t>(static_cast<int64_t>(std::llround(ratio * n_reused)),
                                      static_cast<int64_t>(cand.size()));
  const int64_t n_cand = static_cast<int64_t>(cand.size());
  if (k >= n_cand) return;  // every candidate stays
  // Deviation of fresh V (in v_, row i) from the cached V (in the cache at
  // position rows[i]; the cached layer was loaded before this step), in
  // backend memory up to the k indices the host needs.
  std::vector<int32_t> cand_pos(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) cand_pos[j] = rows[cand[j]];
  // The fresh rows go to scratch_, free until narrow() below.
  scratch_.reserve(static_cast<size_t>(n_cand * kv_dim));
  old_.reserve(static_cast<size_t>(n_cand * kv_dim));
  dev_.reserve(static_cast<size_t>(n_cand));
  be_.gather_rows(v_.data(), kv_dim, cand.data(), n_cand, scratch_.data());
  be_.gather_rows(s_.v_cache(layer), kv_dim, cand_pos.data(), n_cand, old_.data());
  be_.row_sq_diff(scratch_.data(), old_.data(), n_cand, kv_dim, dev_.data());
  std::vector<int32_t> top(static_cast<size_t>(std::max<int64_t>(k, 0)));
  be_.top_k(dev_.data(), n_cand, static_cast<int64_t>(top.size()), top.data());
  std::vector<uint8_t> chosen(rows.size(), 0);
  for (int32_t t : top) chosen[cand[t]] = 1;
  std::vector<int32_t> keep_idx;  // indices into rows, ascending
  for (size_t i = 0; i < rows.size(); ++i)
    if (!is_cached[rows[i]] || rows[i] == n_ - 1 || chosen[i])
      keep_idx.push_back(static_cast<int32_t>(i));
  const int64_t r = static_cast<int64_t>(keep_idx.size());
  auto narrow = [&](BackendFloats& buf, int64_t dim) {
    scratch_.reserve(static_cast<size_t>(r * dim));
    be_.gather_rows(buf.data(), dim, keep_idx.data(), r, scratch_.data());
    std::swap(buf, scratch_);
  };
  narrow(x_, hp_.n_embd);
  narrow(q_, hp_.n_head * hp_.head_dim);
  narrow(k_, hp_.kv_dim());
  narrow(v_, hp_.kv_dim());
  std::vector<int32_t> new_rows(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) new_rows[i] = rows[keep_idx[i]];
  rows.swap(new_rows);
}

void FusedForward::attend_and_ffn(int64_t layer) {
  const LayerWeights& w = s_.layer_weights()[static_cast<size_t>(layer)];
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  // First every carried row's K and V go into the cache, so that the
  // attention below may then run in row batches: a query only needs keys at
  // or before its position, all of which are in place.
  {
    Graph g;
    TensorId q = g.external(q_.data(), r, q_dim);
    TensorId k = g.external(k_.data(), r, kv_dim);
    TensorId v = g.external(v_.data(), r, kv_dim);
    g.rope(q, rows.data(), hp_.n_head, hp_.head_dim, hp_.rot_dim, hp_.rope_freq_base);
    g.rope(k, rows.data(), hp_.n_head_kv, hp_.head_dim, hp_.rot_dim, hp_.rope_freq_base);
    g.scatter_rows(k, rows.data(), g.external(s_.k_cache(layer), s_.n_ctx(), kv_dim));
    g.scatter_rows(v, rows.data(), g.external(s_.v_cache(layer), s_.n_ctx(), kv_dim));
    run_graph(g);
  }
  for (int64_t r0 = 0; r0 < r; r0 += kRowBatch) {
    const int64_t b = std::min(kRowBatch, r - r0);
    Graph g;
    TensorId x = g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd);
    TensorId q = g.external(q_.data() + r0 * q_dim, b, q_dim);
    TensorId kc = g.external(s_.k_cache(layer), s_.n_ctx(), kv_dim);
    TensorId vc = g.external(s_.v_cache(layer), s_.n_ctx(), kv_dim);
    TensorId a =
        g.attention(q, rows.data() + r0, kc, vc, n_, hp_.n_head, hp_.n_head_kv, hp_.head_dim);
    g.add_into(x, g.matmul(w.wo, a));
    TensorId h2 = g.rmsnorm(x, w.ffn_norm, hp_.rms_eps);
    TensorId m = g.silu_mul(g.matmul(w.w_gate, h2), g.matmul(w.w_up, h2));
    g.add_into(x, g.matmul(w.w_down, m));
    run_graph(g);
  }
}

bool FusedForward::layers(LayerPipeline& loads) {
  size_t next_check = 0;
  for (int64_t l = 0; l < hp_.n_layer; ++l) {
    if (!loads.synchronize(l)) {
      failed_chunk = loads.failed_chunk();
      return false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    resize_buffers();
    project(l);
    if (next_check < schedule.size() && schedule[next_check].layer == l)
      select(l, schedule[next_check++].ratio);
    rows_per_layer.push_back(static_cast<int64_t>(rows.size()));
    attend_and_ffn(l);
    layer_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return true;
}

bool FusedForward::run(bool want_logits) {
  x_.reserve(rows.size() * static_cast<size_t>(hp_.n_embd));
  {
    std::vector<int32_t> ids(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) ids[i] = tokens_[rows[i]];
    be_.get_rows(s_.token_embd(), ids.data(), static_cast<int64_t>(ids.size()), x_.data());
  }
  {
    // The loader starts as soon as the pipeline exists and is joined when it
    // goes out of scope, also when a layer throws.
    LayerPipeline loads(s_, cached, pipeline);
    const bool ok = layers(loads);
    loads.finish();
    load_stats = loads.stats();
    if (!ok) return false;
  }
  if (want_logits) {
    // rows is ascending and always holds n-1: its hidden state is the last.
    Graph g;
    TensorId last = g.external(x_.data() + (rows.size() - 1) * hp_.n_embd, 1, hp_.n_embd);
    TensorId hn = g.rmsnorm(last, s_.model().output_norm(), hp_.rms_eps);
    g.matmul_into(s_.output(), hn, g.external(s_.logits_buffer().data(), 1, hp_.n_vocab));
    run_graph(g);
  }
  return true;
}

void check_request(Session& s, int64_t n) {
  if (s.n_past() != 0) fail(ErrorCode::kInvalidArgument, "fusion needs an empty session");
  if (n == 0) fail(ErrorCode::kInvalidArgument, "the request has no tokens");
  if (n > s.n_ctx())
    fail(ErrorCode::kContextOverflow, "request of " + std::to_string(n) +
                                          " tokens does not fit the context of " +
                                          std::to_string(s.n_ctx()));
}

}  // namespace

std::span<const float> fuse_prefill(Session& s, std::span<const Segment> segments,
                                    const BlendOptions& opts, FusionStats* stats,
                                    const PipelineOptions& pipeline) {
  const LlamaHparams& hp = s.model().hparams();
  validate_blend_options(opts, hp.n_layer);
  if (segments.empty()) fail(ErrorCode::kInvalidArgument, "no segments to fuse");
  std::vector<int32_t> tokens;
  for (const Segment& seg : segments)
    tokens.insert(tokens.end(), seg.tokens.begin(), seg.tokens.end());
  const int64_t n = static_cast<int64_t>(tokens.size());
  check_request(s, n);
  const auto t0 = std::chrono::steady_clock::now();

  FusionStats local;
  FusionStats& st = stats ? *stats : local;
  st = FusionStats{};
  st.n_tokens = n;
  st.pipelined = pipeline.enabled;

  if (opts.mode == BlendMode::kFull) {
    auto logits = s.prefill(tokens);
    st.rows_per_layer.assign(static_cast<size_t>(hp.n_layer), n);
    st.final_rows.resize(static_cast<size_t>(n));
    std::iota(st.final_rows.begin(), st.final_rows.end(), 0);
    st.ratio = 1.0;
    st.compute_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    st.recompute_ms = st.compute_ms;
    return logits;
  }
  const bool blend = opts.mode == BlendMode::kBlend;
  st.ratio = !blend ? 0.0 : opts.schedule.empty() ? 1.0 : opts.schedule.back().ratio;

  // Which segments' cached KV this mode uses.  A chunk that fails to load is
  // dropped from the set and the request runs again (it is then computed).
  std::vector<uint8_t> use(segments.size(), 0);
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    if (!seg.cached || seg.tokens.empty()) continue;
    // Prefix caching: only the leading run of segments whose KV was computed
    // after exactly the tokens before them; the rest is computed.
    if (opts.mode == BlendMode::kPrefix && !seg.exact_prefix) break;
    use[i] = 1;
  }

  for (;;) {
    FusedForward f(s, tokens);
    f.is_cached.assign(static_cast<size_t>(n), 0);
    int32_t pos = 0;
    std::vector<size_t> seg_of_cached;
    for (size_t i = 0; i < segments.size(); ++i) {
      const int32_t len = static_cast<int32_t>(segments[i].tokens.size());
      if (use[i]) {
        f.cached.push_back({segments[i].cached, pos, len});
        seg_of_cached.push_back(i);
        std::fill(f.is_cached.begin() + pos, f.is_cached.begin() + pos + len, 1);
        f.n_reused += len;
      }
      pos += len;
    }
    // The last token's logits are the output: it is always computed.
    if (f.is_cached[n - 1]) --f.n_reused;
    f.pipeline = pipeline;
    for (int32_t p = 0; p < n; ++p)
      if (blend || !f.is_cached[p] || p == n - 1) f.rows.push_back(p);
    if (blend) f.schedule = opts.schedule;
    const bool ok = f.run(true);
    st.bytes_read += f.load_stats.bytes_read;
    st.load_ms += f.load_stats.load_ms();
    st.fetch_ms += f.load_stats.fetch_ms;
    st.upload_ms += f.load_stats.upload_ms;
    st.blocked_ms += f.load_stats.blocked_ms;
    for (double ms : f.layer_ms) st.recompute_ms += ms;
    if (ok) {
      st.n_reused = f.n_reused;
      st.rows_per_layer = std::move(f.rows_per_layer);
      st.final_rows = std::move(f.rows);
      st.layer_ms = std::move(f.layer_ms);
      break;
    }
    use[seg_of_cached[f.failed_chunk]] = 0;
    ++st.chunks_recomputed;
  }
  s.set_n_past(n);
  st.compute_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s.logits_buffer();
}

cache::ChunkKV precompute_chunk_kv(Session& scratch, std::span<const int32_t> head,
                                   std::span<const int32_t> chunk) {
  if (chunk.empty()) fail(ErrorCode::kInvalidArgument, "cannot precompute an empty chunk");
  std::vector<int32_t> tokens(head.begin(), head.end());
  tokens.insert(tokens.end(), chunk.begin(), chunk.end());
  const int64_t n = static_cast<int64_t>(tokens.size());
  check_request(scratch, n);
  const int64_t n_vocab = scratch.model().hparams().n_vocab;
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab)
      fail(ErrorCode::kInvalidArgument,
           "token id " + std::to_string(t) + " is outside the vocabulary");
  const LlamaHparams& hp = scratch.model().hparams();
  cache::ChunkKV kv(
      cache::KvShape{static_cast<int32_t>(hp.n_layer), static_cast<int32_t>(chunk.size()),
                     static_cast<int32_t>(hp.n_head_kv), static_cast<int32_t>(hp.head_dim)});
  FusedForward f(scratch, tokens);
  f.is_cached.assign(static_cast<size_t>(n), 0);
  f.rows.resize(static_cast<size_t>(n));
  std::iota(f.rows.begin(), f.rows.end(), 0);
  f.capture = &kv;
  f.capture_begin = static_cast<int32_t>(head.size());
  f.run(false);
  scratch.set_n_past(0);
  return kv;
}

}  // namespace cb
