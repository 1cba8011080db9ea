// cb_bench ttft: time to first token of a RAG request, per mode and policy.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"

namespace cbbench {

namespace {

// Varied English prose: the pool chunks are cut from.
const char* const kPool[] = {
    "The old lighthouse stood at the edge of the harbor for more than a century. Every evening "
    "the keeper climbed the spiral stairs, trimmed the wick and polished the great lens until it "
    "shone. Ships coming home through the fog counted the seconds between flashes and knew where "
    "they were.",
    "Sourdough bread depends on a culture of wild yeast and lactic acid bacteria. Bakers feed the "
    "starter with flour and water, wait until it doubles, and mix a small portion into the dough. "
    "A long, cool fermentation gives the crumb its open texture and the crust its slight sourness.",
    "In 1859 a solar storm lit up the night sky so brightly that gold miners in the Rocky "
    "Mountains woke and began making breakfast. Telegraph lines sparked, some operators received "
    "shocks, and a few stations kept sending messages with their batteries disconnected.",
    "The committee met on a rainy Tuesday to review the budget for the new library wing. The "
    "architect presented three designs: one in glass and steel, one in brick to match the town "
    "hall, and a cheaper timber frame that could be finished before the winter.",
    "Octopuses have three hearts and blue blood. Two of the hearts pump blood through the gills, "
    "while the third circulates it to the rest of the body. Most of their neurons are in their "
    "arms, which can taste and touch and react even when separated from the brain.",
    "The railway reached the valley in the spring of 1887. Within ten years the village had a "
    "post office, two hotels and a school, and farmers could send fresh milk to the city every "
    "morning. The old coaching road was soon overgrown with nettles and wild roses.",
    "A compiler translates source code into machine instructions in several stages. The parser "
    "builds a syntax tree, the optimizer rewrites it into faster but equivalent forms, and the "
    "code generator assigns registers and emits the instructions the processor will execute.",
    "During the long drought the river dropped so low that the ruins of a drowned village "
    "appeared: stone walls, a church tower and the arches of a bridge that had been under water "
    "for forty years. Families who had once lived there came back to walk its streets again.",
    "Chess players use opening books, but the middle game rewards imagination. A knight on an "
    "outpost, a pawn that cramps the enemy position or an open file for a rook can decide a game "
    "long before any piece is captured.",
    "The volunteers counted birds along the coast every January. They recorded ducks, geese, "
    "gulls and waders, noted the weather and the tide, and sent their sheets to the society, "
    "which has kept the same survey going without a break since 1952.",
};
constexpr size_t kPoolSize = sizeof(kPool) / sizeof(kPool[0]);

const char* const kQueryPool =
    "Using the documents above, explain what the keeper of the lighthouse did every evening, "
    "how sourdough bread gets its texture, what happened during the solar storm of 1859, which "
    "designs the architect presented, why octopuses have three hearts, and how the railway "
    "changed the village in the valley";

// `text` (repeated as needed) cut to n tokens and turned back into text.
std::string text_of_tokens(const Model& model, const std::string& text, size_t n) {
  std::vector<int32_t> ids = tokenize(model, text, false, false);
  if (ids.empty()) runtime_error("the benchmark text tokenizes to nothing");
  const std::vector<int32_t> unit = ids;
  while (ids.size() < n) ids.insert(ids.end(), unit.begin(), unit.end());
  ids.resize(n);
  size_t len = 0;
  check(cb_detokenize(model.h, ids.data(), ids.size(), 0, nullptr, 0, &len), "cannot detokenize");
  std::vector<char> buf(len + 1);
  check(cb_detokenize(model.h, ids.data(), ids.size(), 0, buf.data(), buf.size(), &len),
        "cannot detokenize");
  return std::string(buf.data(), len);
}

// Chunk i: "Document i." then the pool's paragraphs from paragraph i on.
std::string bench_chunk(const Model& model, size_t i, size_t n_tokens) {
  std::string text = "Document " + std::to_string(i + 1) + ". ";
  for (size_t k = 0; k < kPoolSize; ++k) {
    text += kPool[(i + k) % kPoolSize];
    text += ' ';
  }
  return text_of_tokens(model, text, n_tokens);
}

struct TtftRow {
  cb_mode mode;
  float ratio_opt;                       // the ratio asked for (blend)
  cb_select select = CB_SELECT_DEFAULT;  // blend's policy
  double storage_mbps = 0.0;             // the store's read cap; 0: none
  double ttft_ms, compute_ms;
  std::vector<double> runs;
  cb_rag_stats st;  // of the last run
  double load_ms = 0.0, blocked_ms = 0.0, upload_ms = 0.0, fetch_ms = 0.0;
};

// TTFT per mode against the read cap (several --storage-mbps), else against
// the ratio (several --ratio; modes without a ratio are flat lines), else
// one point per mode.
void plot_ttft(const std::string& png, const std::vector<TtftRow>& rows,
               const std::vector<double>& caps, const std::vector<float>& ratios, int n_chunks,
               int chunk_tokens, const std::string& compute) {
  PlotSpec spec;
  spec.title = "TTFT, " + std::to_string(n_chunks) + " chunks x " + std::to_string(chunk_tokens) +
               " tokens, " + compute;
  spec.ylabel = "TTFT (ms, median)";
  auto series_name = [](const TtftRow& r) {
    return r.mode == CB_MODE_BLEND ? "blend r=" + ratio_label(r.ratio_opt)
                                   : std::string(cb_mode_name(r.mode));
  };
  auto series_for = [&](const std::string& name) -> PlotSeries& {
    for (auto& s : spec.series)
      if (s.name == name) return s;
    spec.series.push_back({name, {}, false});
    return spec.series.back();
  };
  if (caps.size() > 1) {
    spec.xlabel = "chunk store read cap (MB/s)";
    spec.logx = true;
    for (const auto& r : rows)
      series_for(series_name(r)).points.push_back({r.storage_mbps, r.ttft_ms});
  } else if (ratios.size() > 1) {
    spec.xlabel = "recompute ratio r (blend)";
    std::vector<double> xs;
    for (const auto& r : rows)
      if (r.mode == CB_MODE_BLEND) xs.push_back(static_cast<double>(r.st.ratio));
    const double lo = xs.empty() ? 0.0 : *std::min_element(xs.begin(), xs.end());
    const double hi = xs.empty() ? 1.0 : *std::max_element(xs.begin(), xs.end());
    PlotSeries blend{"blend", {}, false};
    for (const auto& r : rows) {
      if (r.mode == CB_MODE_BLEND && r.ratio_opt != kAutoRatio) {
        blend.points.push_back({static_cast<double>(r.st.ratio), r.ttft_ms});
      } else if (r.mode == CB_MODE_BLEND) {
        // The controller's pick, at the ratio it chose.
        spec.series.push_back(
            {"blend auto", {{static_cast<double>(r.st.ratio), r.ttft_ms}}, false});
      } else {
        spec.series.push_back({cb_mode_name(r.mode), {{lo, r.ttft_ms}, {hi, r.ttft_ms}}, true});
      }
    }
    std::sort(blend.points.begin(), blend.points.end());
    if (!blend.points.empty()) spec.series.insert(spec.series.begin(), blend);
  } else {
    spec.xlabel = "mode";
    PlotSeries s{"TTFT", {}, false};
    for (const auto& r : rows) {
      s.points.push_back({static_cast<double>(spec.categories.size()), r.ttft_ms});
      spec.categories.push_back(series_name(r));
    }
    spec.series.push_back(s);
  }
  draw_plot(png, spec);
}

// ttft's options; the common ones are read after them.
TtftOptions parse_ttft_options(const Args& a) {
  if (!a.values.count("--chunks")) usage_error("ttft needs --chunks N");
  if (!a.values.count("--chunk-tokens")) usage_error("ttft needs --chunk-tokens T");
  TtftOptions o;
  o.n_chunks = static_cast<int>(parse_int(a, "--chunks", 0, 1, 4096));
  o.chunk_tokens = static_cast<int>(parse_int(a, "--chunk-tokens", 0, 1, 1 << 20));
  o.query_tokens = static_cast<int>(parse_int(a, "--query-tokens", 32, 1, 1 << 20));
  o.repeat = static_cast<int>(parse_int(a, "--repeat", 3, 1, 1000));
  o.ratios = parse_ratios(a, true);
  o.modes = parse_modes(a, a.values.count("--tiers") ? "full,blend" : "full,prefix,reuse,blend");
  o.head = parse_chunk_head(a);
  o.sel = parse_select_options(a);
  o.caps = parse_storage_caps(a, true);
  o.plot = plot_path(a);
  o.fetch_threads = static_cast<int>(parse_int(a, "--fetch-threads", 0, 0, 64));
  return o;
}

// The chunks, cut from the pool, and the question, ending with "?".
TtftRequest make_request(const Model& model, const TtftOptions& o) {
  TtftRequest req;
  for (int i = 0; i < o.n_chunks; ++i)
    req.chunks.push_back(
        bench_chunk(model, static_cast<size_t>(i), static_cast<size_t>(o.chunk_tokens)));
  req.question =
      text_of_tokens(model, kQueryPool, static_cast<size_t>(std::max(1, o.query_tokens - 1))) + "?";
  return req;
}

// The session's context: --n-ctx, else room for the request (the chunks as
// tokenized, the question, and the prompt's fixed parts: system turn,
// separators, assistant header) up to the model's context.
int request_n_ctx(const Model& model, const Common& c, const TtftRequest& req, int n_ctx_train) {
  long long need = static_cast<long long>(tokenize(model, req.question, false, false).size()) + 96;
  for (const auto& t : req.chunks)
    need += static_cast<long long>(tokenize(model, t, false, false).size()) + 4;
  return c.n_ctx > 0 ? c.n_ctx : static_cast<int>(std::min<long long>(need, n_ctx_train));
}

// Warms the cache (and every page of the weights), untimed: a request that
// computes the chunks, and one that reads them back (which keeps them in a
// GPU's memory where the session keeps chunks there); with --ratio auto the
// controller's first-use probe (and a first refresh) too.
void warm_cache(const TtftOptions& o, const Session& session, const ChunkCache& cache,
                const TtftRequest& req, cb_rag_options& ro) {
  const std::vector<const char*> chunks = req.chunk_ptrs();
  cb_rag_stats st;
  ro.mode = CB_MODE_BLEND;
  set_ratio(ro, 0.15f);
  rag_prefill(session, cache, chunks, req.question, ro, st);
  check(cb_chunk_cache_flush(cache.h), "cannot flush the chunk cache");
  rag_prefill(session, cache, chunks, req.question, ro, st);
  if (std::find(o.ratios.begin(), o.ratios.end(), kAutoRatio) != o.ratios.end()) {
    set_ratio(ro, kAutoRatio);
    rag_prefill(session, cache, chunks, req.question, ro, st);
  }
}

// The rows of one read cap: every mode, blend once per policy and ratio.
void add_rows(const TtftOptions& o, double storage_mbps, std::vector<TtftRow>& rows) {
  for (cb_mode mode : o.modes) {
    const std::vector<float> rs = mode == CB_MODE_BLEND ? o.ratios : std::vector<float>{0.15f};
    const std::vector<cb_select> ss =
        mode == CB_MODE_BLEND ? o.sel.selects : std::vector<cb_select>{CB_SELECT_DEFAULT};
    for (cb_select p : ss)
      for (float r : rs) {
        TtftRow row{};
        row.mode = mode;
        row.ratio_opt = r;
        row.select = p;
        row.storage_mbps = storage_mbps;
        rows.push_back(row);
      }
  }
}

// Times rows[first..], `repeat` times each, and sets their medians.
// Repeats are interleaved (every mode and ratio once, then again), so that
// a burst of load on a shared machine hits them all alike.
void time_rows(const TtftOptions& o, const Session& session, const ChunkCache& cache,
               const TtftRequest& req, cb_rag_options& ro, std::vector<TtftRow>& rows,
               size_t first) {
  const std::vector<const char*> chunks = req.chunk_ptrs();
  cb_rag_stats st;
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 1;
  std::vector<std::vector<double>> compute(rows.size()), load(rows.size()), blocked(rows.size()),
      upload(rows.size()), fetch(rows.size());
  for (int k = 0; k < o.repeat; ++k) {
    for (size_t i = first; i < rows.size(); ++i) {
      TtftRow& row = rows[i];
      ro.mode = row.mode;
      ro.select = row.select;
      set_ratio(ro, row.ratio_opt);
      check(cb_session_reset(session.h), "cannot reset the session");
      const auto t0 = Clock::now();
      rag_prefill(session, cache, chunks, req.question, ro, st);
      check(cb_generate(session.h, nullptr, 0, &go, nullptr, nullptr, nullptr),
            "cannot sample the first token");
      const auto t1 = Clock::now();
      row.runs.push_back(ms_between(t0, t1));
      compute[i].push_back(st.recompute_ms);
      load[i].push_back(st.load_ms);
      blocked[i].push_back(st.blocked_ms);
      upload[i].push_back(st.upload_ms);
      fetch[i].push_back(st.fetch_ms);
      row.st = st;
    }
  }
  for (size_t i = first; i < rows.size(); ++i) {
    rows[i].ttft_ms = median(rows[i].runs);
    rows[i].compute_ms = median(compute[i]);
    rows[i].load_ms = median(load[i]);
    rows[i].blocked_ms = median(blocked[i]);
    rows[i].upload_ms = median(upload[i]);
    rows[i].fetch_ms = median(fetch[i]);
  }
}

// Every mode and ratio once per read cap (one pass when none is set).
std::vector<TtftRow> measure_ttft(const Args& a, const TtftOptions& o, const Session& session,
                                  ChunkCache& cache, const TtftRequest& req) {
  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = o.head;
  apply_select_options(o.sel, ro);
  ro.pipeline = parse_on_off(a, "--pipeline", true) ? 1 : 0;
  ro.fetch_threads = o.fetch_threads;
  std::vector<TtftRow> rows;
  const size_t n_caps = std::max<size_t>(1, o.caps.size());
  for (size_t ci = 0; ci < n_caps; ++ci) {
    if (ci > 0) reopen_with_cap(cache, o.caps[ci]);
    warm_cache(o, session, cache, req, ro);
    const size_t first = rows.size();
    add_rows(o, o.caps.empty() ? 0.0 : o.caps[ci], rows);
    time_rows(o, session, cache, req, ro, rows, first);
  }
  return rows;
}

// Full prefill's TTFT under the same read cap (0 when not run).
double full_ms_at(const std::vector<TtftRow>& rows, double cap) {
  for (const auto& r : rows)
    if (r.mode == CB_MODE_FULL && r.storage_mbps == cap) return r.ttft_ms;
  return 0.0;
}

void print_ttft_json(const std::vector<TtftRow>& rows, const TtftOptions& o, const Common& c,
                     const Model& model, const std::string& codec) {
  for (const auto& r : rows) {
    const double full_ms = full_ms_at(rows, r.storage_mbps);
    cbs::JsonObject j = header("ttft", c, model, cb_mode_name(r.mode));
    j.add("ttft_ms", r.ttft_ms)
        .add("load_ms", r.load_ms)
        .add("compute_ms", r.compute_ms)
        .add("blocked_ms", r.blocked_ms)
        .add("upload_ms", r.upload_ms)
        .add("fetch_ms", r.fetch_ms)
        .add("fetch_threads", static_cast<int64_t>(o.fetch_threads))
        .add("ratio", ratio_value(r.st.ratio))
        .add("ratio_mode", r.ratio_opt == kAutoRatio ? "auto" : "fixed")
        .add("select", r.mode == CB_MODE_BLEND ? cb_select_name(r.select) : "none")
        .add("sink_tokens", static_cast<int64_t>(o.sel.sink_tokens))
        .add("chunk_shift", o.sel.chunk_shift)
        .add("shift_probes", o.sel.chunk_shift ? static_cast<double>(o.sel.shift_probes) : 0.0)
        .add("shift_span", static_cast<int64_t>(o.sel.chunk_shift ? o.sel.shift_span : 0))
        .add("pipeline", r.st.pipelined != 0)
        .add("bytes_read", static_cast<int64_t>(r.st.bytes_read))
        .add("resident_hits", r.st.resident_hits)
        .add("resident_bytes", static_cast<int64_t>(r.st.resident_bytes))
        .add("n_ctx", r.st.n_tokens)
        .add("computed_fraction", r.st.computed_fraction)
        .add("cache_hits", r.st.cache_hits)
        .add("cache_misses", r.st.cache_misses)
        .add("n_reused", r.st.n_reused)
        .add("chunks", static_cast<int64_t>(o.n_chunks))
        .add("chunk_tokens", static_cast<int64_t>(o.chunk_tokens))
        .add("query_tokens", static_cast<int64_t>(o.query_tokens))
        .add("chunk_head", chunk_head_label(o.head))
        .add("codec", codec)
        .add("repeat", static_cast<int64_t>(o.repeat))
        .add("stat", "median")
        .add("ttft_ms_runs", r.runs);
    if (r.storage_mbps > 0.0)
      j.add("storage_mbps", r.storage_mbps);
    else
      j.add_null("storage_mbps");
    if (full_ms > 0.0)
      j.add("ttft_vs_full", r.ttft_ms / full_ms);
    else
      j.add_null("ttft_vs_full");
    std::printf("%s\n", j.str().c_str());
  }
}

void print_ttft_table(const std::vector<TtftRow>& rows, const TtftOptions& o, const Common& c,
                      const Model& model, const std::string& codec) {
  std::printf(
      "ttft: %d chunks x %d tokens, question %d tokens, request %d tokens; %s (%s), "
      "%s; chunk head %s, %s; median of %d\n",
      o.n_chunks, o.chunk_tokens, o.query_tokens, rows.empty() ? 0 : rows[0].st.n_tokens,
      cbs::printable(model_name(model)).c_str(), kernels_name(model).c_str(),
      compute_label(c, model).c_str(), chunk_head_label(o.head), cache_label(codec).c_str(),
      o.repeat);
  if (!o.caps.empty()) std::printf("%8s ", "MB/s");
  std::printf("%-7s %-9s %6s %10s %11s %9s %10s %9s %5s %7s %8s\n", "mode", "select", "ratio",
              "ttft_ms", "compute_ms", "load_ms", "blocked_ms", "computed", "hits", "misses",
              "vs_full");
  for (const auto& r : rows) {
    const double full_ms = full_ms_at(rows, r.storage_mbps);
    if (!o.caps.empty()) std::printf("%8g ", r.storage_mbps);
    char vs[32] = "-";
    if (full_ms > 0.0) std::snprintf(vs, sizeof vs, "%.3f", r.ttft_ms / full_ms);
    char ratio[16];
    std::snprintf(ratio, sizeof ratio, r.ratio_opt == kAutoRatio ? "a%.2f" : "%.2f",
                  static_cast<double>(r.st.ratio));
    std::printf("%-7s %-9s %6s %10.1f %11.1f %9.1f %10.1f %9.3f %5d %7d %8s\n",
                cb_mode_name(r.mode), r.mode == CB_MODE_BLEND ? cb_select_name(r.select) : "-",
                ratio, r.ttft_ms, r.compute_ms, r.load_ms, r.blocked_ms, r.st.computed_fraction,
                r.st.cache_hits, r.st.cache_misses, vs);
  }
}

}  // namespace

std::vector<const char*> TtftRequest::chunk_ptrs() const {
  std::vector<const char*> out;
  for (const auto& t : chunks) out.push_back(t.c_str());
  return out;
}

int cmd_ttft(const Args& a) {
  const TtftOptions o = parse_ttft_options(a);
  const Common c = common_options(a);

  Model model;
  load_model(c, model);
  const int n_ctx_train = model_n_ctx_train(model);
  const long long need_min = static_cast<long long>(o.n_chunks) * o.chunk_tokens + o.query_tokens;
  if (need_min > n_ctx_train)
    runtime_error("the request needs at least " + std::to_string(need_min) +
                  " tokens, more than the model's context of " + std::to_string(n_ctx_train));
  const TtftRequest req = make_request(model, o);

  Session session;
  create_session(model, c, request_n_ctx(model, c, req, n_ctx_train), session);
  if (a.values.count("--tiers")) return ttft_tiers(a, c, o, model, session, req);
  for (const char* f : {"--ram-budget-mb", "--slow-mbps", "--redis", "--placement-ratio"})
    if (a.values.count(f)) usage_error(std::string("option ") + f + " needs --tiers");
  ChunkCache cache;
  const std::string codec = open_chunk_cache(a, cache, true);

  const std::vector<TtftRow> rows = measure_ttft(a, o, session, cache, req);
  if (c.json)
    print_ttft_json(rows, o, c, model, codec);
  else
    print_ttft_table(rows, o, c, model, codec);
  if (!o.plot.empty())
    plot_ttft(o.plot, rows, o.caps, o.ratios, o.n_chunks, o.chunk_tokens, compute_label(c, model));
  return 0;
}

}  // namespace cbbench
