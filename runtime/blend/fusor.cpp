// fuse_prefill: what each mode and policy runs (passes of FusedForward,
// fused_forward.h), the restart without a chunk that failed to load, and the
// request's stats; precompute_chunk_kv: a chunk's KV, captured from a pass.
#include "runtime/blend/fusor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "platform/error.h"
#include "runtime/blend/fused_forward.h"
#include "runtime/llama_layer.h"

namespace cb {

double FusionStats::computed_fraction() const {
  if (n_tokens == 0 || rows_per_layer.empty()) return 0.0;
  double rows = std::accumulate(rows_per_layer.begin(), rows_per_layer.end(), 0.0);
  return rows / (static_cast<double>(n_tokens) * static_cast<double>(rows_per_layer.size()));
}

namespace {

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
      lay.cached.push_back({segments[i].cached, pos, len, segments[i].resident});
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
  f.chunks = lay.cached;
  f.pipeline = pipeline;
  for (int32_t p = load ? 0 : first_inexact(lay); p < n; ++p)
    if (blend || !lay.is_cached[p] || p == n - 1) f.rows.push_back(p);
  if (!blend) return;
  f.schedule = opts.schedule;
  f.selection = opts.selection;
  f.guard_share = opts.guard_share;
  f.guard_max_ratio = opts.guard_max_ratio;
  f.chunk_shift = opts.chunk_shift;
  f.shift_probes = opts.chunk_shift ? opts.shift_probes : 0.0f;
  f.shift_span = opts.shift_span;
}

// The bias of BlendOptions::context_scale: the rows after the last reused
// chunk on the keys of the reused chunks (those before first_inexact are
// exact, as a full prefill has them).
KeyBlockBias context_bias(const RequestLayout& lay, float context_scale) {
  if (context_scale == 1.0f || lay.cached.empty()) return {};
  KeyBlockBias b;
  b.key_begin = first_inexact(lay);
  b.key_end = lay.query_begin;
  b.query_from = lay.query_begin;
  b.bias = std::log(context_scale);
  return b;
}

bool ranks_before_pass(Selection s) {
  return s == Selection::kLookahead || s == Selection::kOracle || s == Selection::kOracleKl;
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
  st.resident_bytes += f.load_stats.resident_bytes;
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

// Rows [0, n) of a KV cache layer's K (or V), on the host.
std::vector<float> download_rows(Session& s, int64_t layer, bool v, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * s.model().hparams().kv_dim()));
  s.read_kv_rows(layer, v, 0, n, out.data());
  return out;
}

// Every layer's KV rows [0, n), on the host.
struct HostKv {
  std::vector<std::vector<float>> k, v;
};
HostKv download_kv(Session& s, int64_t n) {
  const int64_t n_layer = s.model().hparams().n_layer;
  HostKv kv;
  for (int64_t l = 0; l < n_layer; ++l) {
    kv.k.push_back(download_rows(s, l, false, n));
    kv.v.push_back(download_rows(s, l, true, n));
  }
  return kv;
}

// Writes rows idx of `from` into the session's KV cache, every layer.
void put_rows(Session& s, const HostKv& from, const std::vector<int32_t>& idx) {
  const int64_t n_layer = s.model().hparams().n_layer, dim = s.model().hparams().kv_dim();
  const int64_t n = static_cast<int64_t>(idx.size());
  std::vector<float> rows(static_cast<size_t>(n * dim));
  for (int64_t l = 0; l < n_layer; ++l) {
    for (const auto* src : {&from.k, &from.v}) {
      for (int64_t r = 0; r < n; ++r)
        std::copy_n((*src)[l].data() + idx[r] * dim, dim, rows.data() + r * dim);
      void* dst = src == &from.k ? s.k_cache(l) : s.v_cache(l);
      store_kv_rows(s.backend(), s.kv_dtype(), rows.data(), dim, idx.data(), n, dst);
    }
  }
}

// KL(softmax(p) || softmax(q)).
double kl_of_logits(std::span<const float> p, std::span<const float> q) {
  const auto log_sum_exp = [](std::span<const float> x) {
    const float m = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (float v : x) sum += std::exp(static_cast<double>(v) - m);
    return m + std::log(sum);
  };
  const double lp = log_sum_exp(p), lq = log_sum_exp(q);
  double kl = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double a = p[i] - lp, b = q[i] - lq;
    kl += std::exp(a) * (a - b);
  }
  return kl;
}

// Reused rows the answer-effect oracle judges together: finer costs a
// question pass more per request for little change in the choice.
constexpr int64_t kOracleBlock = 16;

// The oracles' ranking (study only), with the reuse pass's KV in the cache:
// kOracle, each token's squared deviation of K and V from a full prefill's,
// summed over layers; kOracleKl, how much the full prefill's KV for the
// token's block of reused rows, put in place of the reused KV, lowers the
// KL of the last token's distribution against the full prefill's (the
// question's rows computed again over it: one pass per block).  Leaves the
// session empty.
std::vector<float> oracle_scores(Session& s, std::span<const int32_t> tokens,
                                 const RequestLayout& lay, Selection sel) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_layer = s.model().hparams().n_layer, dim = s.model().hparams().kv_dim();
  const HostKv reused = download_kv(s, n);
  const std::vector<float> full_logits = [&] {
    auto logits = s.prefill(tokens);
    return std::vector<float>(logits.begin(), logits.end());
  }();
  const HostKv full = download_kv(s, n);
  s.truncate(0);
  std::vector<float> scores(static_cast<size_t>(n), 0.0f);
  if (sel == Selection::kOracle) {
    for (int64_t l = 0; l < n_layer; ++l)
      for (int64_t p = 0; p < n; ++p) {
        double d = 0.0;
        for (int64_t j = p * dim; j < (p + 1) * dim; ++j) {
          const double dk = full.k[l][j] - reused.k[l][j], dv = full.v[l][j] - reused.v[l][j];
          d += dk * dk + dv * dv;
        }
        scores[p] += static_cast<float>(d);
      }
    return scores;
  }
  // The rows from `q` on are computed over the cache; the last one always is.
  const int64_t q = std::min<int64_t>(lay.query_begin, n - 1);
  std::vector<int32_t> head(static_cast<size_t>(q));
  std::iota(head.begin(), head.end(), 0);
  put_rows(s, reused, head);
  const auto kl_over_cache = [&] {
    s.set_n_past(q);
    const double kl = kl_of_logits(full_logits, s.prefill(tokens.subspan(q)));
    s.truncate(0);
    return kl;
  };
  const double kl_reused = kl_over_cache();
  std::vector<int32_t> block;
  for (int64_t p = 0; p < q; ++p) {
    if (lay.is_cached[p] && !lay.exact[p] && !lay.keep_always[p]) block.push_back(p);
    if (block.empty() || (static_cast<int64_t>(block.size()) < kOracleBlock && p + 1 < q)) continue;
    put_rows(s, full, block);
    const float gain = static_cast<float>(kl_reused - kl_over_cache());
    for (int32_t r : block) scores[r] = gain;
    put_rows(s, reused, block);
    block.clear();
  }
  return scores;
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

  // A plain prefill of every token: FULL, and a request left without any
  // cached KV (every chunk failed to load), which is then exactly FULL.
  const auto full_prefill = [&] {
    auto logits = s.prefill(tokens);
    st.rows_per_layer.assign(static_cast<size_t>(hp.n_layer), n);
    st.final_rows.resize(static_cast<size_t>(n));
    std::iota(st.final_rows.begin(), st.final_rows.end(), 0);
    st.ratio = 1.0;
    st.compute_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    st.recompute_ms = st.compute_ms;
    return logits;
  };
  // Whatever this request leaves in the session, a bias of an earlier one
  // does not apply to it.
  s.set_context_bias({});
  if (opts.mode == BlendMode::kFull) return full_prefill();
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

  // The options this request runs with.
  const bool any_cached = std::any_of(use.begin(), use.end(), [](uint8_t u) { return u != 0; });
  for (;;) {
    if (any_cached && std::none_of(use.begin(), use.end(), [](uint8_t u) { return u != 0; }))
      return full_prefill();
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
    // The progress report counts the layers of both passes as one stage.
    const bool ranking_pass = blend && ranks_before_pass(used.selection) && ranking.chooses;
    const int64_t progress_total = (ranking_pass ? 2 : 1) * hp.n_layer;
    if (ranking_pass) {
      // A reuse pass: the question's attention at every layer (lookahead),
      // or the reused KV to hold against a full prefill's (oracle).
      FusedForward look(s, tokens);
      configure(look, lay, false, true, used, pipeline);
      look.progress_total = progress_total;
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
        prior = oracle_scores(s, tokens, lay, used.selection);
      }
    } else if (blend && used.selection == Selection::kRandom) {
      prior = random_scores(n, used.seed);
    }
    if (ok) {
      s.set_context_bias(context_bias(lay, used.context_scale));
      FusedForward f(s, tokens);
      configure(f, lay, blend, !loaded, used, pipeline);
      f.progress_first = progress_total - hp.n_layer;
      f.progress_total = progress_total;
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
        st.probe_rows.clear();
        for (size_t p = 0; p < f.probe.size(); ++p)
          if (f.probe[p]) st.probe_rows.push_back(static_cast<int32_t>(p));
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

cache::KvShape chunk_kv_shape(const Model& model, size_t n_tokens) {
  const LlamaHparams& hp = model.hparams();
  return {static_cast<int32_t>(hp.n_layer), static_cast<int32_t>(n_tokens),
          static_cast<int32_t>(hp.n_head_kv), static_cast<int32_t>(hp.head_dim)};
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
  cache::ChunkKV kv(chunk_kv_shape(scratch.model(), chunk.size()));
  FusedForward f(scratch, tokens);
  f.is_cached.assign(static_cast<size_t>(n), 0);
  f.keep_always.assign(static_cast<size_t>(n), 1);
  f.exact.assign(static_cast<size_t>(n), 0);
  f.rows.resize(static_cast<size_t>(n));
  std::iota(f.rows.begin(), f.rows.end(), 0);
  f.capture = &kv;
  f.capture_begin = static_cast<int32_t>(head.size());
  f.progress_stage = ProgressStage::kChunk;
  f.run(false);
  scratch.set_n_past(0);
  return kv;
}

}  // namespace cb
