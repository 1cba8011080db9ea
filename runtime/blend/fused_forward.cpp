#include "runtime/blend/fused_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <utility>

#include "runtime/blend/selection.h"
#include "runtime/llama_layer.h"

namespace cb {

void FusedForward::run_graph(Graph& g) {
  // One arena for the whole request, grown on demand: a layer's
  // intermediates are dead once its graph has run.
  arena_.reserve((g.plan() + sizeof(float) - 1) / sizeof(float));
  g.execute(be_, arena_.data(), 0, SIZE_MAX, s_.stop_check());
}

const LayerWeights& FusedForward::weights(int64_t layer) const {
  return s_.layer_weights()[static_cast<size_t>(layer)];
}

void FusedForward::resize_buffers() {
  const size_t r = rows.size();
  q_.reserve(r * static_cast<size_t>(hp_.n_head * hp_.head_dim));
  k_.reserve(r * static_cast<size_t>(hp_.kv_dim()));
  v_.reserve(r * static_cast<size_t>(hp_.kv_dim()));
}

void FusedForward::project(int64_t layer) {
  const LayerWeights& w = weights(layer);
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  // Rows in the session's batches, as a prefill (rows are independent here).
  const int64_t batch = s_.n_batch();
  for (int64_t r0 = 0; r0 < r; r0 += batch) {
    const int64_t b = std::min(batch, r - r0);
    Graph g;
    LlamaLayer block(g, hp_, w, layer, s_.prefill_precision());
    TensorId h = block.attention_input(g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd));
    block.project_q(h, g.external(q_.data() + r0 * q_dim, b, q_dim));
    block.project_k(h, g.external(k_.data() + r0 * kv_dim, b, kv_dim));
    block.project_v(h, g.external(v_.data() + r0 * kv_dim, b, kv_dim));
    run_graph(g);
  }
  if (capture) {
    // Rows are all positions here (capture runs a plain prefill); keep the
    // chunk's part, K still un-rotated.
    const int64_t off = capture_begin * kv_dim, len = (n_ - capture_begin) * kv_dim;
    copy_to_host(be_, k_.data() + off, len, capture->k_layer(static_cast<int>(layer)));
    copy_to_host(be_, v_.data() + off, len, capture->v_layer(static_cast<int>(layer)));
  }
}

AttentionArgs FusedForward::question_rows(const float* q, const int32_t* pos, int64_t n_q,
                                          int64_t layer) {
  AttentionArgs a = attention_args(hp_, layer, q, pos, n_q, s_.k_cache(layer), s_.v_cache(layer),
                                   s_.kv_dtype(), n_);
  a.key_bias = s_.context_bias();
  return a;
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
  load_kv_rows(be_, s_.kv_dtype(), s_.v_cache(layer), kv_dim, cand_pos.data(), n_cand, old_.data());
  be_.row_sq_diff(fresh_.data(), old_.data(), n_cand * parts, part_len, dev_.data());
  if (with_k) {
    // The cache holds K rotated to its position: rotate the fresh K alike.
    be_.gather_rows(k_.data(), kv_dim, cand.data(), n_cand, fresh_.data());
    rope_keys(be_, hp_, layer, weights(layer), fresh_.data(), cand_pos.data(), n_cand);
    load_kv_rows(be_, s_.kv_dtype(), s_.k_cache(layer), kv_dim, cand_pos.data(), n_cand,
                 old_.data());
    be_.row_sq_diff(fresh_.data(), old_.data(), n_cand * parts, part_len,
                    dev_.data() + n_cand * parts);
  }
  // One row of 2 x n_cand x parts floats, brought to the host.
  std::vector<float> d(static_cast<size_t>((with_k ? 2 : 1) * n_cand * parts));
  copy_to_host(be_, dev_.data(), static_cast<int64_t>(d.size()), d.data());
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
  rope_keys(be_, hp_, layer, weights(layer), old_.data(), u_pos.data(), nu);
  store_kv_rows(be_, s_.kv_dtype(), old_.data(), kv_dim, u_pos.data(), nu, s_.k_cache(layer));
  be_.gather_rows(v_.data(), kv_dim, u_idx.data(), nu, old_.data());
  store_kv_rows(be_, s_.kv_dtype(), old_.data(), kv_dim, u_pos.data(), nu, s_.v_cache(layer));
  fresh_.reserve(static_cast<size_t>(nq * q_dim));
  be_.gather_rows(q_.data(), q_dim, q_idx.data(), nq, fresh_.data());
  rope_queries(be_, hp_, layer, weights(layer), fresh_.data(), q_pos.data(), nq);
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
  int64_t n_probe = 0;
  if (first && shift_probes > 0.0f) {
    // The probes first, evenly spread over the candidates (in position
    // order, so every chunk gets its share); the policy picks the rest.
    n_probe = std::min<int64_t>(
        k, std::llround(static_cast<double>(shift_probes) * static_cast<double>(k)));
    const double step = static_cast<double>(cand.size()) / static_cast<double>(n_probe);
    probe.assign(static_cast<size_t>(n_), 0);
    for (int64_t i = 0; i < n_probe; ++i) {
      const auto j = static_cast<size_t>((static_cast<double>(i) + 0.5) * step);
      chosen[cand[j]] = 1;
      probe[cand_pos[j]] = 1;
      score[j] = -std::numeric_limits<float>::infinity();
    }
  }
  const TokenChoice choice =
      choose_tokens(score, k - n_probe, first ? guard_share : 0.0, max_k - n_probe);
  if (first) {
    selected_share = choice.share;
    guard_raised = choice.raised;
    if (choice.raised && k > 0)
      ratio_scale = static_cast<double>(static_cast<int64_t>(choice.chosen.size()) + n_probe) /
                    static_cast<double>(k);
  }
  for (int32_t t : choice.chosen) chosen[cand[t]] = 1;
}

namespace {

// Where span i of n (equal ones) of [begin, begin + len) starts.
int32_t span_begin(int32_t begin, int32_t len, int64_t i, int64_t n) {
  return begin + static_cast<int32_t>(i * len / n);
}

// BlendOptions::shift_span: how many spans the chunk [begin, begin + len)
// is cut into, about one per `span` tokens but as many only as leave two or
// more of `measured` (ascending positions) in each.
int64_t span_count(int32_t begin, int32_t len, int64_t span, std::span<const int32_t> measured) {
  if (span <= 0) return 1;
  for (int64_t n = std::max<int64_t>(1, std::llround(static_cast<double>(len) / span)); n > 1;
       --n) {
    bool enough = true;
    for (int64_t i = 0; i < n && enough; ++i) {
      const auto lo =
          std::lower_bound(measured.begin(), measured.end(), span_begin(begin, len, i, n));
      const auto hi = std::lower_bound(lo, measured.end(), span_begin(begin, len, i + 1, n));
      enough = hi - lo >= 2;
    }
    if (enough) return n;
  }
  return 1;
}

// Where each of n spans of [begin, begin + len) starts in `at` (ascending
// positions), and at.size() last: n + 1 offsets.
std::vector<int64_t> span_offsets(int32_t begin, int32_t len, int64_t n,
                                  std::span<const int32_t> at) {
  std::vector<int64_t> off(static_cast<size_t>(n + 1));
  for (int64_t i = 0; i <= n; ++i)
    off[i] = std::lower_bound(at.begin(), at.end(), span_begin(begin, len, i, n)) - at.begin();
  return off;
}

}  // namespace

// Every chunk the shift moves at once, so a layer's shift is the same few
// backend ops however many chunks there are (a GPU pays per op).  Chunk
// after chunk: its measured rows (sel), its other rows (rest), and the
// segments of sel whose means make the corrections.
struct FusedForward::ShiftPlan {
  std::vector<int32_t> sel_idx, sel_pos, sel_neg;  // index into rows, position, -position
  std::vector<int32_t> rest_pos, rest_neg;
  std::vector<int32_t> chunk_seg{0}, span_seg{0};  // offsets into sel
  std::vector<int32_t> rest_span;  // per rest row: the span whose correction it takes
  // The spans of chunks cut in more than one, and each one's chunk: their
  // correction is half the chunk's mean and half the span's.
  std::vector<int32_t> split_span, split_chunk;
  std::vector<int32_t> sel_order;  // 0, 1, ...: sel copied (gather_rows)
};

FusedForward::ShiftPlan FusedForward::plan_shift() const {
  ShiftPlan p;
  std::vector<int32_t> idx, pos, rest;
  for (const CachedChunkRef& c : chunks) {
    const int32_t end = c.begin + c.len;
    if (c.len == 0 || exact[c.begin]) continue;
    // The chunk's recomputed rows (rows is ascending) and the others.
    idx.clear();
    pos.clear();
    for (auto it = std::lower_bound(rows.begin(), rows.end(), c.begin);
         it != rows.end() && *it < end; ++it) {
      idx.push_back(static_cast<int32_t>(it - rows.begin()));
      pos.push_back(*it);
    }
    if (pos.empty() || static_cast<int32_t>(pos.size()) == c.len) continue;
    rest.clear();
    for (int32_t q = c.begin, j = 0; q < end; ++q) {
      if (j < static_cast<int32_t>(pos.size()) && pos[j] == q)
        ++j;
      else
        rest.push_back(q);
    }
    // The correction is measured on the chunk's probes when it has two or
    // more (BlendOptions::shift_probes), else on all its recomputed tokens.
    if (!probe.empty() &&
        std::count_if(pos.begin(), pos.end(), [&](int32_t q) { return probe[q] != 0; }) >= 2) {
      size_t m = 0;
      for (size_t j = 0; j < pos.size(); ++j)
        if (probe[pos[j]]) {
          idx[m] = idx[j];
          pos[m++] = pos[j];
        }
      idx.resize(m);
      pos.resize(m);
    }
    // BlendOptions::shift_span: span i's measured rows are [sel_at[i],
    // sel_at[i + 1]) of pos, its other rows [rest_at[i], rest_at[i + 1]) of rest.
    const int64_t n_span = span_count(c.begin, c.len, shift_span, pos);
    const std::vector<int64_t> sel_at = span_offsets(c.begin, c.len, n_span, pos);
    const std::vector<int64_t> rest_at = span_offsets(c.begin, c.len, n_span, rest);
    const auto chunk = static_cast<int32_t>(p.chunk_seg.size() - 1);
    const auto base = static_cast<int32_t>(p.sel_pos.size());
    for (size_t j = 0; j < pos.size(); ++j) {
      p.sel_idx.push_back(idx[j]);
      p.sel_pos.push_back(pos[j]);
      p.sel_neg.push_back(-pos[j]);
    }
    for (int32_t q : rest) {
      p.rest_pos.push_back(q);
      p.rest_neg.push_back(-q);
    }
    for (int64_t i = 0; i < n_span; ++i) {
      const auto span = static_cast<int32_t>(p.span_seg.size() - 1);
      p.span_seg.push_back(base + static_cast<int32_t>(sel_at[i + 1]));
      p.rest_span.insert(p.rest_span.end(), static_cast<size_t>(rest_at[i + 1] - rest_at[i]), span);
      if (n_span > 1) {
        p.split_span.push_back(span);
        p.split_chunk.push_back(chunk);
      }
    }
    p.chunk_seg.push_back(base + static_cast<int32_t>(pos.size()));
  }
  if (!p.split_span.empty()) {
    p.sel_order.resize(p.sel_pos.size());
    std::iota(p.sel_order.begin(), p.sel_order.end(), 0);
  }
  return p;
}

void FusedForward::shift_chunks(int64_t layer) {
  const ShiftPlan p = plan_shift();
  const int64_t kv_dim = hp_.kv_dim();
  const auto n_sel = static_cast<int64_t>(p.sel_pos.size());
  const auto n_rest = static_cast<int64_t>(p.rest_pos.size());
  const auto n_span = static_cast<int64_t>(p.span_seg.size() - 1);
  const auto n_chunk = static_cast<int64_t>(p.chunk_seg.size() - 1);
  const auto n_split = static_cast<int64_t>(p.split_span.size());
  if (n_sel == 0) return;
  fresh_.reserve(static_cast<size_t>(n_sel * kv_dim));
  old_.reserve(static_cast<size_t>(std::max(n_sel, n_rest) * kv_dim));
  corr_.reserve(static_cast<size_t>((n_span + n_chunk) * kv_dim));
  shift_scratch_.reserve(static_cast<size_t>(
      std::max(n_split > 0 ? n_sel : 0, std::max(n_rest, 2 * n_split)) * kv_dim));
  float* chunk_mean = corr_.data() + n_span * kv_dim;
  float* tmp = shift_scratch_.data();
  for (const bool is_k : {true, false}) {
    void* cache = is_k ? s_.k_cache(layer) : s_.v_cache(layer);
    // fresh - cached over the measured rows, K compared before RoPE so
    // that one correction fits every position.
    be_.gather_rows(is_k ? k_.data() : v_.data(), kv_dim, p.sel_idx.data(), n_sel, fresh_.data());
    load_kv_rows(be_, s_.kv_dtype(), cache, kv_dim, p.sel_pos.data(), n_sel, old_.data());
    if (is_k) rope_keys(be_, hp_, layer, weights(layer), old_.data(), p.sel_neg.data(), n_sel);
    be_.scale(old_.data(), n_sel * kv_dim, -1.0f);
    be_.add(fresh_.data(), old_.data(), n_sel * kv_dim, fresh_.data());
    // The chunks' means from a copy: segment_means uses its rows as scratch.
    if (n_split > 0) be_.gather_rows(fresh_.data(), kv_dim, p.sel_order.data(), n_sel, tmp);
    be_.segment_means(fresh_.data(), kv_dim, p.span_seg.data(), n_span, corr_.data());
    if (n_split > 0) {
      be_.segment_means(tmp, kv_dim, p.chunk_seg.data(), n_chunk, chunk_mean);
      // A split span's correction: half its chunk's mean and half its own.
      be_.scale(chunk_mean, n_chunk * kv_dim, 0.5f);
      float* half_chunk = tmp + n_split * kv_dim;
      be_.gather_rows(corr_.data(), kv_dim, p.split_span.data(), n_split, tmp);
      be_.scale(tmp, n_split * kv_dim, 0.5f);
      be_.gather_rows(chunk_mean, kv_dim, p.split_chunk.data(), n_split, half_chunk);
      be_.add(tmp, half_chunk, n_split * kv_dim, tmp);
      be_.scatter_rows(tmp, kv_dim, p.split_span.data(), n_split, corr_.data());
    }
    // The others: cached + their span's correction, K un-rotated and
    // rotated back around it.
    load_kv_rows(be_, s_.kv_dtype(), cache, kv_dim, p.rest_pos.data(), n_rest, old_.data());
    if (is_k) rope_keys(be_, hp_, layer, weights(layer), old_.data(), p.rest_neg.data(), n_rest);
    be_.gather_rows(corr_.data(), kv_dim, p.rest_span.data(), n_rest, tmp);
    be_.add(old_.data(), tmp, n_rest * kv_dim, old_.data());
    if (is_k) rope_keys(be_, hp_, layer, weights(layer), old_.data(), p.rest_pos.data(), n_rest);
    store_kv_rows(be_, s_.kv_dtype(), old_.data(), kv_dim, p.rest_pos.data(), n_rest, cache);
  }
}

void FusedForward::attend_and_ffn(int64_t layer, int64_t out_begin) {
  const LayerWeights& w = weights(layer);
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
  if (chunk_shift) shift_chunks(layer);
  // First every carried row's K and V go into the cache, so that the
  // attention below may then run in row batches: a query only needs keys at
  // or before its position, all of which are in place.
  {
    Graph g;
    LlamaLayer block(g, hp_, w, layer, s_.prefill_precision());
    TensorId k = g.external(k_.data(), r, kv_dim);
    TensorId v = g.external(v_.data(), r, kv_dim);
    block.rope_q(g.external(q_.data(), r, q_dim), rows.data());
    block.rope_k(k, rows.data());
    g.scatter_rows(k, rows.data(),
                   g.external_kv(s_.k_cache(layer), s_.n_ctx(), kv_dim, s_.kv_dtype()));
    g.scatter_rows(v, rows.data(),
                   g.external_kv(s_.v_cache(layer), s_.n_ctx(), kv_dim, s_.kv_dtype()));
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
  const int64_t batch = s_.n_batch();
  for (int64_t r0 = out_begin; r0 < r; r0 += batch) {
    const int64_t b = std::min(batch, r - r0);
    Graph g;
    LlamaLayer block(g, hp_, w, layer, s_.prefill_precision());
    TensorId x = g.external(x_.data() + r0 * hp_.n_embd, b, hp_.n_embd);
    TensorId q = g.external(q_.data() + r0 * q_dim, b, q_dim);
    TensorId kc = g.external_kv(s_.k_cache(layer), s_.n_ctx(), kv_dim, s_.kv_dtype());
    TensorId vc = g.external_kv(s_.v_cache(layer), s_.n_ctx(), kv_dim, s_.kv_dtype());
    block.attention_output(x, block.attention(q, rows.data() + r0, kc, vc, n_, s_.context_bias()));
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
    const auto layer = [&] {
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
    };
    // One batch a layer: a GPU backend waits once for the layer's ops, not
    // after each of its graphs.  (The host reads only what ops hand to host
    // memory, which completes at once, batch or not.)  A chunk's precompute
    // copies its rows on the host as each projection ends: not batched.
    if (capture)
      layer();
    else
      run_batch(be_, layer);
    layer_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    s_.report_progress(progress_stage, progress_first + l + 1,
                       progress_total > 0 ? progress_total : hp_.n_layer);
  }
  return true;
}

bool FusedForward::run(bool want_logits) {
  x_.reserve(rows.size() * static_cast<size_t>(hp_.n_embd));
  {
    std::vector<int32_t> ids(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) ids[i] = tokens_[rows[i]];
    embed_tokens(be_, hp_, s_.token_embd(), ids.data(), static_cast<int64_t>(ids.size()),
                 x_.data());
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
    add_output_head(g, hp_, s_.output_norm(), s_.output(), last,
                    g.external(s_.logits_buffer().data(), 1, hp_.n_vocab), s_.prefill_precision());
    run_graph(g);
  }
  return true;
}

}  // namespace cb
