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
#include <random>
#include <utility>

#include "platform/error.h"
#include "runtime/blend/layer_pipeline.h"
#include "runtime/blend/selection.h"
#include "runtime/graph.h"
#include "runtime/llama_layer.h"

namespace cb {

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
  // How the first check ranks the candidates; `prior` (per position), when
  // set, holds the scores a pass before this one measured.
  Selection selection = Selection::kHkvd;
  std::vector<float> prior;
  std::vector<uint8_t> keep_always;  // per position: computed at every layer
  std::vector<uint8_t> exact;        // per position: cached KV that is exact, never recomputed
  int32_t query_begin = 0;           // the question's rows are those at or after it
  float guard_share = 0.0f, guard_max_ratio = 0.0f;
  // When set (n_layer x n floats), each layer adds what every position
  // contributes to the question's attention output (attention weight times
  // value norm, Backend::attention_contributions).
  std::vector<float>* attention_by_layer = nullptr;
  // After the first check: the chosen tokens' share of the policy's total
  // score, whether the guard added tokens, and the factor it scaled the
  // schedule's counts by.
  double selected_share = 1.0;
  bool guard_raised = false;
  double ratio_scale = 1.0;
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
  bool layers(LayerPipeline& loads, bool want_logits);
  void project(int64_t layer);  // step 1
  // Check layer: narrows the rows to the kept ones.  `projected`: step 1 has
  // run, so Q/K/V narrow too (and fresh KV may be measured).
  void select(int64_t layer, float ratio, bool first, bool projected);
  // The k best of the candidate rows `cand` (indices into rows) by the
  // policy's score, marked in `chosen`; sets the guard's stats when first.
  void choose(int64_t layer, bool first, const std::vector<int32_t>& cand, int64_t k,
              std::vector<uint8_t>& chosen);
  // Step 2.  Every carried row's K/V goes into the cache (and the
  // question's contributions are taken); attention and FFN then run for
  // the rows from `out_begin` (an index into rows) on: at the last layer
  // only the logits' row, or none, is read.
  void attend_and_ffn(int64_t layer, int64_t out_begin);
  void run_graph(Graph& g);
  void resize_buffers();
  // Candidate scores of the check layer `layer`, into host memory.
  void deviation(int64_t layer, std::span<const int32_t> cand, std::span<const int32_t> cand_pos,
                 bool with_k, std::vector<float>& score);
  void question_attention(int64_t layer, std::span<const int32_t> cand_pos,
                          std::vector<float>& score);
  AttentionArgs question_rows(const float* q, const int32_t* pos, int64_t n_q, int64_t layer);

  Session& s_;
  const LlamaHparams& hp_;
  Backend& be_;
  std::span<const int32_t> tokens_;
  int64_t n_;
  // rows.size() x dim each; scratch_ is narrow()'s destination.
  BackendFloats x_{be_}, q_{be_}, k_{be_}, v_{be_}, scratch_{be_};
  // select()'s fresh and cached rows and deviations
  BackendFloats fresh_{be_}, old_{be_}, dev_{be_};
  BackendFloats arena_{be_};
};

void FusedForward::run_graph(Graph& g) {
  // One arena for the whole request, grown on demand: a layer's
  // intermediates are dead once its graph has run.
  arena_.reserve((g.plan() + sizeof(float) - 1) / sizeof(float));
  g.execute(be_, arena_.data(), 0, SIZE_MAX, s_.stop_check());
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
    LlamaLayer layer(g, hp_, w);
    TensorId h = layer.attention_input(g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd));
    layer.project_q(h, g.external(q_.data() + r0 * q_dim, b, q_dim));
    layer.project_k(h, g.external(k_.data() + r0 * kv_dim, b, kv_dim));
    layer.project_v(h, g.external(v_.data() + r0 * kv_dim, b, kv_dim));
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

AttentionArgs FusedForward::question_rows(const float* q, const int32_t* pos, int64_t n_q,
                                          int64_t layer) {
  return attention_args(hp_, q, pos, n_q, s_.k_cache(layer), s_.v_cache(layer), n_);
}

void FusedForward::deviation(int64_t layer, std::span<const int32_t> cand,
                             std::span<const int32_t> cand_pos, bool with_k,
                             std::vector<float>& score) {
  const int64_t kv_dim = hp_.kv_dim(), n_cand = static_cast<int64_t>(cand.size());
  // Per KV head when K joins: the heads' scales differ, so each head's
  // deviation is taken relative to its mean over the candidates.
  const int64_t parts = with_k ? hp_.n_head_kv : 1, part_len = kv_dim / parts;
  fresh_.reserve(static_cast<size_t>(n_cand * kv_dim));
  old_.reserve(static_cast<size_t>(n_cand * kv_dim));
  dev_.reserve(static_cast<size_t>(2 * n_cand * parts));
  // The cached layer was loaded before this step; fresh rows are in v_/k_.
  be_.gather_rows(v_.data(), kv_dim, cand.data(), n_cand, fresh_.data());
  be_.gather_rows(s_.v_cache(layer), kv_dim, cand_pos.data(), n_cand, old_.data());
  be_.row_sq_diff(fresh_.data(), old_.data(), n_cand * parts, part_len, dev_.data());
  if (with_k) {
    // The cache holds K rotated to its position: rotate the fresh K alike.
    be_.gather_rows(k_.data(), kv_dim, cand.data(), n_cand, fresh_.data());
    rope_keys(be_, hp_, fresh_.data(), cand_pos.data(), n_cand);
    be_.gather_rows(s_.k_cache(layer), kv_dim, cand_pos.data(), n_cand, old_.data());
    be_.row_sq_diff(fresh_.data(), old_.data(), n_cand * parts, part_len,
                    dev_.data() + n_cand * parts);
  }
  // One row of 2 x n_cand x parts floats, brought to the host.
  const int32_t zero = 0;
  std::vector<float> d(static_cast<size_t>((with_k ? 2 : 1) * n_cand * parts));
  be_.gather_rows(dev_.data(), static_cast<int64_t>(d.size()), &zero, 1, d.data());
  score.assign(static_cast<size_t>(n_cand), 0.0f);
  if (!with_k) {
    std::copy(d.begin(), d.end(), score.begin());
    return;
  }
  for (int64_t block = 0; block < 2; ++block) {
    const float* dv = d.data() + block * n_cand * parts;
    for (int64_t h = 0; h < parts; ++h) {
      double mean = 0.0;
      for (int64_t j = 0; j < n_cand; ++j) mean += dv[j * parts + h];
      mean /= static_cast<double>(n_cand);
      if (mean <= 0.0) continue;
      for (int64_t j = 0; j < n_cand; ++j) score[j] += static_cast<float>(dv[j * parts + h] / mean);
    }
  }
}

void FusedForward::question_attention(int64_t layer, std::span<const int32_t> cand_pos,
                                      std::vector<float>& score) {
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  std::vector<int32_t> q_idx, q_pos, u_idx, u_pos;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= query_begin) {
      q_idx.push_back(static_cast<int32_t>(i));
      q_pos.push_back(rows[i]);
    }
    if (!is_cached[rows[i]]) {
      u_idx.push_back(static_cast<int32_t>(i));
      u_pos.push_back(rows[i]);
    }
  }
  score.assign(cand_pos.size(), 0.0f);
  if (q_idx.empty()) return;
  const int64_t nq = static_cast<int64_t>(q_idx.size()), nu = static_cast<int64_t>(u_idx.size());
  // The uncached rows' K and V go into the cache now (attend_and_ffn
  // writes the same values again), so the question sees every key of this
  // layer: fresh where computed, cached elsewhere.
  old_.reserve(static_cast<size_t>(nu * kv_dim));
  be_.gather_rows(k_.data(), kv_dim, u_idx.data(), nu, old_.data());
  rope_keys(be_, hp_, old_.data(), u_pos.data(), nu);
  be_.scatter_rows(old_.data(), kv_dim, u_pos.data(), nu, s_.k_cache(layer));
  be_.gather_rows(v_.data(), kv_dim, u_idx.data(), nu, old_.data());
  be_.scatter_rows(old_.data(), kv_dim, u_pos.data(), nu, s_.v_cache(layer));
  fresh_.reserve(static_cast<size_t>(nq * q_dim));
  be_.gather_rows(q_.data(), q_dim, q_idx.data(), nq, fresh_.data());
  rope_queries(be_, hp_, fresh_.data(), q_pos.data(), nq);
  std::vector<float> sums(static_cast<size_t>(n_), 0.0f);
  be_.attention_contributions(question_rows(fresh_.data(), q_pos.data(), nq, layer), sums.data());
  for (size_t j = 0; j < cand_pos.size(); ++j) score[j] = sums[cand_pos[j]];
}

void FusedForward::select(int64_t layer, float ratio, bool first, bool projected) {
  // Candidates: the reused rows still carried whose KV is not exact and not
  // always computed.  The last position is always kept: its logits are the
  // request's output.
  std::vector<int32_t> cand;  // indices into rows
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t p = rows[i];
    if (is_cached[p] && !keep_always[p] && !exact[p] && p != n_ - 1)
      cand.push_back(static_cast<int32_t>(i));
  }
  const int64_t n_cand = static_cast<int64_t>(cand.size());
  const double r = std::min(1.0, static_cast<double>(ratio) * ratio_scale);
  const int64_t k = std::min<int64_t>(
      static_cast<int64_t>(std::llround(r * static_cast<double>(n_reused))), n_cand);
  std::vector<uint8_t> chosen(rows.size(), 0);
  if (k >= n_cand) {
    // Every candidate stays; only the rows whose cached KV is exact leave.
    for (int32_t i : cand) chosen[i] = 1;
  } else {
    choose(layer, first, cand, k, chosen);
  }
  std::vector<int32_t> keep_idx;  // indices into rows, ascending
  for (size_t i = 0; i < rows.size(); ++i)
    if (keep_always[rows[i]] || rows[i] == n_ - 1 || chosen[i])
      keep_idx.push_back(static_cast<int32_t>(i));
  const int64_t r_kept = static_cast<int64_t>(keep_idx.size());
  if (r_kept == static_cast<int64_t>(rows.size())) return;
  auto narrow = [&](BackendFloats& buf, int64_t dim) {
    scratch_.reserve(static_cast<size_t>(r_kept * dim));
    be_.gather_rows(buf.data(), dim, keep_idx.data(), r_kept, scratch_.data());
    std::swap(buf, scratch_);
  };
  narrow(x_, hp_.n_embd);
  if (projected) {
    narrow(q_, hp_.n_head * hp_.head_dim);
    narrow(k_, hp_.kv_dim());
    narrow(v_, hp_.kv_dim());
  }
  std::vector<int32_t> new_rows(static_cast<size_t>(r_kept));
  for (int64_t i = 0; i < r_kept; ++i) new_rows[i] = rows[keep_idx[i]];
  rows.swap(new_rows);
}

void FusedForward::choose(int64_t layer, bool first, const std::vector<int32_t>& cand, int64_t k,
                          std::vector<uint8_t>& chosen) {
  std::vector<int32_t> cand_pos(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) cand_pos[j] = rows[cand[j]];
  std::vector<float> score;
  if (first && !prior.empty()) {
    score.resize(cand.size());
    for (size_t j = 0; j < cand.size(); ++j) score[j] = prior[cand_pos[j]];
  } else if (first && selection == Selection::kAttention) {
    question_attention(layer, cand_pos, score);
  } else {
    deviation(layer, cand, cand_pos, first && selection == Selection::kHkvdKv, score);
  }
  const int64_t max_k =
      first && guard_share > 0.0f
          ? static_cast<int64_t>(std::llround(guard_max_ratio * static_cast<double>(n_reused)))
          : k;
  const TokenChoice choice = choose_tokens(score, k, first ? guard_share : 0.0, max_k);
  if (first) {
    selected_share = choice.share;
    guard_raised = choice.raised;
    if (choice.raised && k > 0)
      ratio_scale = static_cast<double>(choice.chosen.size()) / static_cast<double>(k);
  }
  for (int32_t t : choice.chosen) chosen[cand[t]] = 1;
}

void FusedForward::attend_and_ffn(int64_t layer, int64_t out_begin) {
  const LayerWeights& w = s_.layer_weights()[static_cast<size_t>(layer)];
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  // First every carried row's K and V go into the cache, so that the
  // attention below may then run in row batches: a query only needs keys at
  // or before its position, all of which are in place.
  {
    Graph g;
    LlamaLayer block(g, hp_, w);
    TensorId k = g.external(k_.data(), r, kv_dim);
    TensorId v = g.external(v_.data(), r, kv_dim);
    block.rope_q(g.external(q_.data(), r, q_dim), rows.data());
    block.rope_k(k, rows.data());
    g.scatter_rows(k, rows.data(), g.external(s_.k_cache(layer), s_.n_ctx(), kv_dim));
    g.scatter_rows(v, rows.data(), g.external(s_.v_cache(layer), s_.n_ctx(), kv_dim));
    run_graph(g);
  }
  if (attention_by_layer) {
    // The layer's keys are all in place now; the question's rows are last.
    const int64_t i0 = std::lower_bound(rows.begin(), rows.end(), query_begin) - rows.begin();
    if (i0 < r)
      be_.attention_contributions(
          question_rows(q_.data() + i0 * q_dim, rows.data() + i0, r - i0, layer),
          attention_by_layer->data() + layer * n_);
  }
  for (int64_t r0 = out_begin; r0 < r; r0 += kRowBatch) {
    const int64_t b = std::min(kRowBatch, r - r0);
    Graph g;
    LlamaLayer block(g, hp_, w);
    TensorId x = g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd);
    TensorId q = g.external(q_.data() + r0 * q_dim, b, q_dim);
    TensorId kc = g.external(s_.k_cache(layer), s_.n_ctx(), kv_dim);
    TensorId vc = g.external(s_.v_cache(layer), s_.n_ctx(), kv_dim);
    block.attention_output(x, block.attention(q, rows.data() + r0, kc, vc, n_));
    block.ffn(x);
    run_graph(g);
  }
}

bool FusedForward::layers(LayerPipeline& loads, bool want_logits) {
  size_t next_check = 0;
  for (int64_t l = 0; l < hp_.n_layer; ++l) {
    if (!loads.synchronize(l)) {
      failed_chunk = loads.failed_chunk();
      return false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const bool check = next_check < schedule.size() && schedule[next_check].layer == l;
    // A ranking known before the pass needs no fresh KV: the rows narrow
    // before their projections, so the dropped ones cost nothing here.
    const bool ranked = check && next_check == 0 && !prior.empty();
    if (ranked) select(l, schedule[next_check++].ratio, true, false);
    resize_buffers();
    project(l);
    if (check && !ranked) {
      select(l, schedule[next_check].ratio, next_check == 0, true);
      ++next_check;
    }
    rows_per_layer.push_back(static_cast<int64_t>(rows.size()));
    // After the last layer only the last row's hidden state is read (the
    // logits), and only when they are wanted.
    const int64_t n_rows = static_cast<int64_t>(rows.size());
    attend_and_ffn(l, l + 1 < hp_.n_layer ? 0 : want_logits ? n_rows - 1 : n_rows);
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
    const bool ok = layers(loads, want_logits);
    loads.finish();
    load_stats = loads.stats();
    if (!ok) return false;
  }
  if (want_logits) {
    // rows is ascending and always holds n-1: its hidden state is the last.
    Graph g;
    TensorId last = g.external(x_.data() + (rows.size() - 1) * hp_.n_embd, 1, hp_.n_embd);
    add_output_head(g, hp_, s_.model().output_norm(), s_.output(), last,
                    g.external(s_.logits_buffer().data(), 1, hp_.n_vocab));
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

// What each position of one attempt is: the cached chunks it loads (in
// position order) and the per-position flags the fusion needs.
struct RequestLayout {
  std::vector<CachedChunkRef> cached;
  std::vector<size_t> seg_of_cached;  // segment index of each cached chunk
  std::vector<uint8_t> is_cached, exact, keep_always;
  int64_t n_reused = 0;
  int32_t query_begin = 0;  // after the last cached position
};

RequestLayout layout_request(std::span<const Segment> segments, const std::vector<uint8_t>& use,
                             int64_t n, int64_t sink_tokens) {
  RequestLayout lay;
  lay.is_cached.assign(static_cast<size_t>(n), 0);
  lay.exact.assign(static_cast<size_t>(n), 0);
  lay.keep_always.assign(static_cast<size_t>(n), 0);
  int32_t pos = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const int32_t len = static_cast<int32_t>(segments[i].tokens.size());
    if (use[i]) {
      lay.cached.push_back({segments[i].cached, pos, len});
      lay.seg_of_cached.push_back(i);
      std::fill(lay.is_cached.begin() + pos, lay.is_cached.begin() + pos + len, 1);
      if (segments[i].exact_prefix)
        std::fill(lay.exact.begin() + pos, lay.exact.begin() + pos + len, 1);
      else
        std::fill(lay.keep_always.begin() + pos,
                  lay.keep_always.begin() + pos + std::min<int64_t>(sink_tokens, len), 1);
      lay.n_reused += len;
      lay.query_begin = pos + len;
    }
    pos += len;
  }
  for (int64_t p = 0; p < n; ++p)
    if (!lay.is_cached[p]) lay.keep_always[p] = 1;
  // The last token's logits are the output: it is always computed.
  if (lay.is_cached[n - 1]) --lay.n_reused;
  return lay;
}

// The first position whose KV a blend can change: the rows before it (the
// prompt head, a leading exact chunk) attend only to each other, so once a
// pass has left their KV in the cache, a later pass need not carry them.
int32_t first_inexact(const RequestLayout& lay) {
  const int32_t n = static_cast<int32_t>(lay.is_cached.size());
  for (int32_t p = 0; p < n; ++p)
    if (lay.is_cached[p] && !lay.exact[p]) return p;
  return n - 1;
}

// Sets f up for one pass: every position computed at layer 0 (blend) or
// only the uncached ones (reuse: the cached KV as it is); the chunks are
// loaded unless an earlier pass of the attempt left them in the cache, and
// then the rows before first_inexact() are not computed again.
void configure(FusedForward& f, const RequestLayout& lay, bool blend, bool load,
               const BlendOptions& opts, const PipelineOptions& pipeline) {
  const int64_t n = static_cast<int64_t>(lay.is_cached.size());
  f.is_cached = lay.is_cached;
  f.exact = lay.exact;
  f.keep_always = lay.keep_always;
  f.n_reused = lay.n_reused;
  f.query_begin = lay.query_begin;
  if (load) f.cached = lay.cached;
  f.pipeline = pipeline;
  for (int32_t p = load ? 0 : first_inexact(lay); p < n; ++p)
    if (blend || !lay.is_cached[p] || p == n - 1) f.rows.push_back(p);
  if (!blend) return;
  f.schedule = opts.schedule;
  f.selection = opts.selection;
  f.guard_share = opts.guard_share;
  f.guard_max_ratio = opts.guard_max_ratio;
}

bool ranks_before_pass(Selection s) {
  return s == Selection::kLookahead || s == Selection::kOracle;
}

// What a policy that ranks in a pass of its own (ranks_before_pass) would
// compute, against a full prefill.
struct RankingCost {
  bool chooses = false;  // the first check keeps some but not all candidates
  bool cheaper_than_full = true;
};

RankingCost ranking_cost(const RequestLayout& lay, const BlendOptions& opts, int64_t n_layer) {
  const int64_t n = static_cast<int64_t>(lay.is_cached.size());
  // The blend pass starts at the first inexact row (configure()).
  const int64_t begin = first_inexact(lay);
  int64_t n_cand = 0, n_kept = 0;
  for (int64_t p = begin; p < n; ++p) {
    const bool last = p + 1 == n;
    n_cand += !last && lay.is_cached[p] && !lay.keep_always[p] && !lay.exact[p];
    n_kept += lay.keep_always[p] || last;
  }
  const int64_t k = std::llround(opts.schedule.front().ratio * static_cast<double>(lay.n_reused));
  RankingCost c;
  // Keeping none or all of them needs no ranking.
  c.chooses = k > 0 && k < n_cand;
  // The reuse pass (the uncached rows at every layer), then the blend pass
  // (every row it carries before the first check, the kept ones after it).
  int64_t n_uncached = 0;
  for (int64_t p = 0; p < n; ++p) n_uncached += !lay.is_cached[p] || p + 1 == n;
  const int64_t c0 = opts.schedule.front().layer;
  const double rows =
      static_cast<double>(n_layer * n_uncached + c0 * (n - begin) + (n_layer - c0) * (n_kept + k));
  c.cheaper_than_full = rows < static_cast<double>(n_layer * n);
  return c;
}

// Lookahead's reuse pass pays for itself on requests of long chunks; where
// it and the recompute would together cost more than a full prefill (short
// chunks next to a long prompt head and question), CacheBlend's HKVD ranks
// the tokens instead, in the one pass, from layer 1.
BlendOptions without_costly_lookahead(const BlendOptions& opts, std::span<const Segment> segments,
                                      const std::vector<uint8_t>& use, int64_t n, int64_t n_layer) {
  if (opts.selection != Selection::kLookahead) return opts;
  const RequestLayout lay = layout_request(segments, use, n, opts.sink_tokens);
  const RankingCost cost = ranking_cost(lay, opts, n_layer);
  const int64_t check = first_check_layer(Selection::kHkvd);
  if (!cost.chooses || cost.cheaper_than_full ||
      (opts.schedule.size() > 1 && opts.schedule[1].layer <= check))
    return opts;
  BlendOptions hkvd = opts;
  hkvd.selection = Selection::kHkvd;
  hkvd.schedule.front().layer = std::max(hkvd.schedule.front().layer, check);
  return hkvd;
}

// Adds one pass's loads and timings to the request's stats.
void add_pass(FusionStats& st, const FusedForward& f) {
  st.bytes_read += f.load_stats.bytes_read;
  st.load_ms += f.load_stats.load_ms();
  st.fetch_ms += f.load_stats.fetch_ms;
  st.upload_ms += f.load_stats.upload_ms;
  st.blocked_ms += f.load_stats.blocked_ms;
  for (double ms : f.layer_ms) st.recompute_ms += ms;
}

// Per-layer sums of two passes of one attempt (what the request computed).
template <class T>
void add_per_layer(std::vector<T>& total, const std::vector<T>& pass) {
  if (total.size() < pass.size()) total.resize(pass.size(), T{});
  for (size_t l = 0; l < pass.size(); ++l) total[l] += pass[l];
}

// Rows [0, n) of a KV cache layer, on the host.
std::vector<float> download_rows(Backend& be, const float* layer, int64_t n, int64_t dim) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<float> out(static_cast<size_t>(n * dim));
  be.gather_rows(layer, dim, idx.data(), n, out.data());
  return out;
}

// A seeded uniform score per position: top-k of it is a random pick.
std::vector<float> random_scores(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = static_cast<float>(gen() >> 40) / static_cast<float>(1 << 24);
  return out;
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

  const int64_t kv_dim = hp.kv_dim();
  // The options this request runs with.
  for (;;) {
    // What runs: a failed chunk, now computed, changes what pays.
    const BlendOptions used =
        blend ? without_costly_lookahead(opts, segments, use, n, hp.n_layer) : opts;
    const RequestLayout lay = layout_request(segments, use, n, blend ? used.sink_tokens : 0);
    std::vector<float> prior;
    std::vector<int64_t> rows_per_layer;
    std::vector<double> layer_ms;
    bool loaded = false;  // every cached layer is in the session's cache already
    bool ok = true;
    size_t failed = 0;
    const RankingCost ranking = blend ? ranking_cost(lay, used, hp.n_layer) : RankingCost{};
    if (blend && ranks_before_pass(used.selection) && ranking.chooses) {
      // A reuse pass: the question's attention at every layer (lookahead),
      // or the reused KV to hold against a full prefill's (oracle).
      FusedForward look(s, tokens);
      configure(look, lay, false, true, used, pipeline);
      std::vector<float> by_layer;
      if (used.selection == Selection::kLookahead) {
        by_layer.assign(static_cast<size_t>(hp.n_layer * n), 0.0f);
        look.attention_by_layer = &by_layer;
      }
      ok = look.run(false);
      add_pass(st, look);
      failed = look.failed_chunk;
      if (ok && used.selection == Selection::kLookahead) {
        prior.assign(static_cast<size_t>(n), 0.0f);
        for (int64_t l = 0; l < hp.n_layer; ++l)
          for (int64_t p = 0; p < n; ++p) prior[p] += by_layer[l * n + p];
        add_per_layer(rows_per_layer, look.rows_per_layer);
        add_per_layer(layer_ms, look.layer_ms);
        loaded = true;
      } else if (ok) {
        // Oracle: squared deviation of K and V from a full prefill's, summed
        // over layers; its passes are not counted as the selection's cost.
        std::vector<std::vector<float>> reused_k, reused_v;
        for (int64_t l = 0; l < hp.n_layer; ++l) {
          reused_k.push_back(download_rows(s.backend(), s.k_cache(l), n, kv_dim));
          reused_v.push_back(download_rows(s.backend(), s.v_cache(l), n, kv_dim));
        }
        s.prefill(tokens);
        s.truncate(0);
        prior.assign(static_cast<size_t>(n), 0.0f);
        for (int64_t l = 0; l < hp.n_layer; ++l) {
          const std::vector<float> fk = download_rows(s.backend(), s.k_cache(l), n, kv_dim);
          const std::vector<float> fv = download_rows(s.backend(), s.v_cache(l), n, kv_dim);
          for (int64_t p = 0; p < n; ++p) {
            double d = 0.0;
            for (int64_t j = p * kv_dim; j < (p + 1) * kv_dim; ++j) {
              const double dk = fk[j] - reused_k[l][j], dv = fv[j] - reused_v[l][j];
              d += dk * dk + dv * dv;
            }
            prior[p] += static_cast<float>(d);
          }
        }
      }
    } else if (blend && used.selection == Selection::kRandom) {
      prior = random_scores(n, used.seed);
    }
    if (ok) {
      FusedForward f(s, tokens);
      configure(f, lay, blend, !loaded, used, pipeline);
      f.prior = std::move(prior);
      ok = f.run(true);
      add_pass(st, f);
      failed = f.failed_chunk;
      if (ok) {
        st.n_reused = f.n_reused;
        add_per_layer(rows_per_layer, f.rows_per_layer);
        add_per_layer(layer_ms, f.layer_ms);
        st.rows_per_layer = std::move(rows_per_layer);
        st.final_rows = std::move(f.rows);
        st.layer_ms = std::move(layer_ms);
        st.selected_share = blend ? f.selected_share : 0.0;
        st.guard_raised = f.guard_raised;
        if (blend) st.ratio = std::min(1.0, st.ratio * f.ratio_scale);
        break;
      }
    }
    use[lay.seg_of_cached[failed]] = 0;
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
  f.keep_always.assign(static_cast<size_t>(n), 1);
  f.exact.assign(static_cast<size_t>(n), 0);
  f.rows.resize(static_cast<size_t>(n));
  std::iota(f.rows.begin(), f.rows.end(), 0);
  f.capture = &kv;
  f.capture_begin = static_cast<int32_t>(head.size());
  f.run(false);
  scratch.set_n_past(0);
  return kv;
}

}  // namespace cb
