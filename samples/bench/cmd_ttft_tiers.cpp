// cb_bench ttft --tiers: the same request against several chunk stores (all
// in RAM, flash, a read-capped directory, a tiered store), side by side.
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
#include "tier_stats.h"

namespace cbbench {
namespace {

// A store under test: its label, the cache, and the directories it owns.
struct TierStore {
  std::string label;  // ram, flash, slow, tiered
  ChunkCache cache;
  std::vector<std::string> extra_dirs;  // removed after the cache closes
  ~TierStore() {
    cache.reset();
    std::error_code ec;
    for (const std::string& d : extra_dirs) std::filesystem::remove_all(d, ec);
  }
};

std::string temp_dir(const char* what) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/cb_bench_" + what + ".XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    runtime_error("cannot create a temporary directory in " + templ);
  return templ;
}

std::vector<cb_tier_stats> tier_stats_of(const ChunkCache& cache) {
  std::vector<cb_tier_stats> out;
  check(cbs::read_tier_stats(cache.h, out), "cannot read the storage tiers");
  return out;
}

struct TierRow {
  size_t store = 0;  // index into the stores; full prefill uses none
  cb_mode mode = CB_MODE_BLEND;
  float ratio = 0.0f;
  std::vector<double> runs, load, blocked;
  cb_rag_stats st{};
  std::vector<float> logits;  // the first token's, of the last run
  std::vector<double> hits;   // per tier, per request (tiered stores)
  std::vector<std::string> tier_names;
};

// The options that go with --tiers only.
struct TiersOptions {
  std::vector<std::string> labels;  // the stores, in --tiers order
  std::string codec_name;           // of the stores on flash
  cb_codec codec = CB_CODEC_F16;
  double slow_mbps = 0.0;
  uint64_t ram_budget = 0;  // bytes
  float placement_ratio = 0.0f;
  std::string redis;
};

// --tiers: a comma-separated list of ram, flash, slow and tiered, each once.
std::vector<std::string> parse_tier_labels(const std::string& list) {
  std::vector<std::string> labels;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? comma : comma - start);
    if (name != "ram" && name != "flash" && name != "slow" && name != "tiered")
      usage_error("option --tiers: '" + name +
                  "' is not one of ram, flash, slow, tiered (a comma-separated list)");
    if (std::find(labels.begin(), labels.end(), name) != labels.end())
      usage_error("option --tiers: '" + name + "' is listed twice");
    labels.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return labels;
}

TiersOptions parse_tiers_options(const Args& a, const std::vector<float>& ratios) {
  for (const char* f : {"--store", "--storage-mbps"})
    if (a.values.count(f)) usage_error(std::string("option ") + f + " does not go with --tiers");
  if (std::find(ratios.begin(), ratios.end(), kAutoRatio) != ratios.end())
    usage_error("option --tiers takes fixed ratios (not auto)");
  TiersOptions t;
  t.codec_name = a.values.count("--codec") ? a.values.at("--codec") : "f16";
  if (t.codec_name == "q8") {
    t.codec = CB_CODEC_Q8;
  } else if (t.codec_name == "q4") {
    t.codec = CB_CODEC_Q4;
  } else if (t.codec_name != "f16") {
    usage_error("option --codec with --tiers: '" + t.codec_name +
                "' is not one of f16, q8, q4 (the stores on flash; ram is always f32)");
  }
  t.slow_mbps = parse_double(a, "--slow-mbps", 10.0, 0.001, 1e6);
  t.ram_budget =
      static_cast<uint64_t>(parse_double(a, "--ram-budget-mb", 0.0, 0.0, 1 << 20) * 1048576.0);
  t.placement_ratio =
      static_cast<float>(parse_double(a, "--placement-ratio", ratios.front(), 0.0, 1.0));
  t.redis = a.values.count("--redis") ? a.values.at("--redis") : "";
  t.labels = parse_tier_labels(a.values.at("--tiers"));
  const bool has_tiered = std::find(t.labels.begin(), t.labels.end(), "tiered") != t.labels.end();
  if (has_tiered && t.ram_budget == 0)
    usage_error("--tiers tiered needs --ram-budget-mb M (the RAM tier's budget)");
  if (!has_tiered && (t.ram_budget > 0 || !t.redis.empty()))
    usage_error("options --ram-budget-mb and --redis apply to --tiers tiered");
  return t;
}

// The store `label` names: a chunk cache in RAM, else a store in a
// temporary directory (read-capped for slow, with a RAM tier and a slow
// directory for tiered).
std::unique_ptr<TierStore> open_store(const std::string& label, const TiersOptions& o) {
  auto t = std::make_unique<TierStore>();
  t->label = label;
  if (label == "ram") {
    check(cb_chunk_cache_create(&t->cache.h), "cannot create the chunk cache");
    return t;
  }
  cb_store_options so;
  cb_store_options_init(&so);
  so.codec = o.codec;
  t->cache.dir = temp_dir("store");
  t->cache.remove_dir = true;
  std::string slow;
  if (label == "slow") so.read_bytes_per_sec = static_cast<uint64_t>(o.slow_mbps * 1e6);
  if (label == "tiered") {
    slow = temp_dir("slow");
    t->extra_dirs.push_back(slow);
    so.ram_budget_bytes = o.ram_budget;
    so.slow_dir = slow.c_str();
    so.slow_read_bytes_per_sec = static_cast<uint64_t>(o.slow_mbps * 1e6);
    if (!o.redis.empty()) so.redis_address = o.redis.c_str();
    so.placement_ratio = o.placement_ratio;
  }
  t->cache.opts = so;
  check(cb_chunk_cache_open(t->cache.dir.c_str(), &so, &t->cache.h),
        "cannot open the chunk store in '" + t->cache.dir + "'");
  t->cache.opts.slow_dir = nullptr;  // not kept: the string is ours
  t->cache.opts.redis_address = nullptr;
  return t;
}

using Stores = std::vector<std::unique_ptr<TierStore>>;

// Full prefill first (when asked for, once: it uses no store), then every
// store's modes, blend once per ratio.
std::vector<TierRow> plan_rows(const Stores& stores, const std::vector<cb_mode>& modes,
                               const std::vector<float>& ratios) {
  std::vector<TierRow> rows;
  if (std::find(modes.begin(), modes.end(), CB_MODE_FULL) != modes.end()) {
    TierRow r;
    r.mode = CB_MODE_FULL;
    r.ratio = 1.0f;
    rows.push_back(r);
  }
  for (size_t si = 0; si < stores.size(); ++si)
    for (cb_mode mode : modes) {
      if (mode == CB_MODE_FULL) continue;
      for (float ratio : mode == CB_MODE_BLEND ? ratios : std::vector<float>{0.0f}) {
        TierRow r;
        r.store = si;
        r.mode = mode;
        r.ratio = ratio;
        rows.push_back(r);
      }
    }
  return rows;
}

// The request against each store and in each mode and ratio: `repeat`
// interleaved runs (a burst of load hits every store alike), timed to the
// first token, with each tier's hits.
void time_rows(const TtftOptions& o, const Stores& stores, const Session& session,
               const TtftRequest& req, cb_rag_options& ro, std::vector<TierRow>& rows) {
  const std::vector<const char*> chunks = req.chunk_ptrs();
  cb_rag_stats st;
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 1;
  for (int k = 0; k < o.repeat; ++k)
    for (TierRow& r : rows) {
      TierStore& t = *stores[r.store];
      ro.mode = r.mode;
      if (r.mode == CB_MODE_BLEND) set_ratio(ro, r.ratio);
      const std::vector<cb_tier_stats> before = tier_stats_of(t.cache);
      check(cb_session_reset(session.h), "cannot reset the session");
      const auto t0 = Clock::now();
      rag_prefill(session, t.cache, chunks, req.question, ro, st);
      check(cb_generate(session.h, nullptr, 0, &go, nullptr, nullptr, nullptr),
            "cannot sample the first token");
      const auto t1 = Clock::now();
      r.runs.push_back(ms_between(t0, t1));
      r.load.push_back(st.load_ms);
      r.blocked.push_back(st.blocked_ms);
      r.st = st;
      const std::vector<cb_tier_stats> after = tier_stats_of(t.cache);
      r.tier_names.clear();
      if (r.mode != CB_MODE_FULL) r.hits.resize(after.size(), 0.0);
      for (size_t i = 0; i < after.size() && r.mode != CB_MODE_FULL; ++i) {
        // A store without tiers has one, named after the store here.
        r.tier_names.push_back(t.label == "tiered" ? after[i].name : t.label);
        if (i < before.size())
          r.hits[i] += static_cast<double>(after[i].hits - before[i].hits) / o.repeat;
      }
      // The logits the first token was sampled from (the prefill's): read
      // again by a second prefill, untimed, on the last run only.
      if (k + 1 == o.repeat) {
        rag_prefill(session, t.cache, chunks, req.question, ro, st);
        const float* lg = nullptr;
        size_t n_vocab = 0;
        check(cb_session_logits(session.h, &lg, &n_vocab), "cannot read the logits");
        r.logits.assign(lg, lg + n_vocab);
      }
    }
}

// A row's figures as reported, against the baselines: blend from the
// all-in-RAM store (speed, fidelity), and the full prefill (fidelity).
struct TierOut {
  std::string label;
  double ttft = 0, load = 0, blocked = 0, vs_ram = 0, kl_ram = -1, kl_full = -1;
  int same_flash = -1;  // 1: bitwise the flash store's logits; -1: no flash row
};

std::vector<TierOut> compare_rows(const Stores& stores, const std::vector<TierRow>& rows) {
  auto find_row = [&](const std::string& label, const TierRow& like) -> const TierRow* {
    for (const TierRow& r : rows)
      if (r.mode != CB_MODE_FULL && stores[r.store]->label == label && r.mode == like.mode &&
          r.ratio == like.ratio)
        return &r;
    return nullptr;
  };
  const TierRow* full_row = nullptr;
  for (const TierRow& r : rows)
    if (r.mode == CB_MODE_FULL) full_row = &r;
  std::vector<TierOut> outs;
  for (const TierRow& r : rows) {
    TierOut o;
    o.label = r.mode == CB_MODE_FULL ? "-" : stores[r.store]->label;
    o.ttft = median(r.runs);
    o.load = median(r.load);
    o.blocked = median(r.blocked);
    if (const TierRow* ram = r.mode == CB_MODE_FULL ? nullptr : find_row("ram", r)) {
      o.vs_ram = o.ttft / median(ram->runs);
      o.kl_ram = kl_softmax(ram->logits, r.logits);
    }
    if (full_row) o.kl_full = kl_softmax(full_row->logits, r.logits);
    if (const TierRow* fl = r.mode == CB_MODE_FULL ? nullptr : find_row("flash", r))
      o.same_flash = fl->logits == r.logits ? 1 : 0;
    outs.push_back(o);
  }
  return outs;
}

std::string hits_text(const TierRow& r) {
  std::string s;
  for (size_t i = 0; i < r.hits.size(); ++i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%s:%g", i ? " " : "", r.tier_names[i].c_str(), r.hits[i]);
    s += buf;
  }
  return s.empty() ? std::string("-") : s;
}

// What ttft --tiers reports, and from what.
struct TiersReport {
  const Common& c;
  const TtftOptions& o;
  const TiersOptions& t;
  const Model& model;
  const std::vector<TierRow>& rows;
  const std::vector<TierOut>& outs;
};

void print_tiers_json(const TiersReport& p) {
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const TierRow& r = p.rows[i];
    const TierOut& o = p.outs[i];
    cbs::JsonObject j = header("ttft", p.c, p.model, cb_mode_name(r.mode));
    j.add("store", o.label)
        .add("ttft_ms", o.ttft)
        .add("load_ms", o.load)
        .add("blocked_ms", o.blocked)
        .add("ratio", ratio_value(r.st.ratio))
        .add("placement_ratio", ratio_value(p.t.placement_ratio))
        .add("bytes_read", static_cast<int64_t>(r.st.bytes_read))
        .add("cache_hits", r.st.cache_hits)
        .add("cache_misses", r.st.cache_misses)
        .add("n_ctx", r.st.n_tokens)
        .add("chunks", static_cast<int64_t>(p.o.n_chunks))
        .add("chunk_tokens", static_cast<int64_t>(p.o.chunk_tokens))
        .add("query_tokens", static_cast<int64_t>(p.o.query_tokens))
        .add("codec", o.label == "ram" ? std::string("f32") : p.t.codec_name)
        .add("ram_budget_mb", static_cast<double>(p.t.ram_budget) / 1048576.0)
        .add("slow_mbps", p.t.slow_mbps)
        .add("tier_hits_per_request", hits_text(r))
        .add("repeat", static_cast<int64_t>(p.o.repeat))
        .add("stat", "median")
        .add("ttft_ms_runs", r.runs);
    if (o.vs_ram > 0.0)
      j.add("ttft_vs_ram", o.vs_ram).add("kl_vs_ram", o.kl_ram);
    else
      j.add_null("ttft_vs_ram").add_null("kl_vs_ram");
    if (o.kl_full >= 0.0)
      j.add("kl_vs_full", o.kl_full);
    else
      j.add_null("kl_vs_full");
    if (o.same_flash >= 0)
      j.add("logits_identical_to_flash", o.same_flash == 1);
    else
      j.add_null("logits_identical_to_flash");
    std::printf("%s\n", j.str().c_str());
  }
}

void print_tiers_table(const TiersReport& p) {
  std::printf(
      "ttft --tiers: %d chunks x %d tokens, question %d tokens, request %d tokens; %s (%s), "
      "%s; stores on flash %s, slow %g MB/s, RAM budget %g MB, placement r = %g; "
      "median of %d\n",
      p.o.n_chunks, p.o.chunk_tokens, p.o.query_tokens, p.rows.empty() ? 0 : p.rows[0].st.n_tokens,
      cbs::printable(model_name(p.model)).c_str(), kernels_name(p.model).c_str(),
      compute_label(p.c, p.model).c_str(), p.t.codec_name.c_str(), p.t.slow_mbps,
      static_cast<double>(p.t.ram_budget) / 1048576.0, ratio_value(p.t.placement_ratio),
      p.o.repeat);
  std::printf("%-7s %-6s %6s %10s %9s %10s %7s %10s %10s %6s  %s\n", "store", "mode", "ratio",
              "ttft_ms", "load_ms", "blocked_ms", "vs_ram", "kl_vs_ram", "kl_vs_full", "=flash",
              "tier hits per request");
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const TierRow& r = p.rows[i];
    const TierOut& o = p.outs[i];
    char vs[16] = "-", klr[16] = "-", klf[16] = "-";
    if (o.vs_ram > 0.0) {
      std::snprintf(vs, sizeof vs, "%.3f", o.vs_ram);
      std::snprintf(klr, sizeof klr, "%.2e", o.kl_ram);
    }
    if (o.kl_full >= 0.0) std::snprintf(klf, sizeof klf, "%.2e", o.kl_full);
    std::printf("%-7s %-6s %6.2f %10.1f %9.1f %10.1f %7s %10s %10s %6s  %s\n", o.label.c_str(),
                cb_mode_name(r.mode), static_cast<double>(r.st.ratio), o.ttft, o.load, o.blocked,
                vs, klr, klf,
                o.same_flash < 0 ? "-"
                : o.same_flash   ? "yes"
                                 : "no",
                hits_text(r).c_str());
  }
}

// TTFT per store: a series per mode and ratio, full prefill a flat line.
void plot_tiers(const TiersReport& p, const Stores& stores) {
  PlotSpec spec;
  spec.title = "TTFT per chunk store, " + std::to_string(p.o.n_chunks) + " chunks x " +
               std::to_string(p.o.chunk_tokens) + " tokens, " + compute_label(p.c, p.model);
  spec.xlabel = "chunk store";
  spec.ylabel = "TTFT (ms, median)";
  for (const auto& t : stores) spec.categories.push_back(t->label);
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const TierRow& r = p.rows[i];
    const std::string name = r.mode == CB_MODE_BLEND ? "blend r=" + ratio_label(r.ratio)
                                                     : std::string(cb_mode_name(r.mode));
    PlotSeries* s = nullptr;
    for (auto& x : spec.series)
      if (x.name == name) s = &x;
    if (!s) {
      spec.series.push_back({name, {}, r.mode == CB_MODE_FULL});
      s = &spec.series.back();
    }
    if (r.mode == CB_MODE_FULL) {
      s->points = {{0.0, p.outs[i].ttft}, {static_cast<double>(stores.size() - 1), p.outs[i].ttft}};
    } else {
      s->points.push_back({static_cast<double>(r.store), p.outs[i].ttft});
    }
  }
  draw_plot(p.o.plot, spec);
}

}  // namespace

int ttft_tiers(const Args& a, const Common& c, const TtftOptions& o, const Model& model,
               const Session& session, const TtftRequest& req) {
  const TiersOptions t = parse_tiers_options(a, o.ratios);
  Stores stores;
  for (const std::string& label : t.labels) stores.push_back(open_store(label, t));

  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = o.head;
  apply_select_options(o.sel, ro);
  ro.select = o.sel.selects.front();
  ro.pipeline = parse_on_off(a, "--pipeline", true) ? 1 : 0;
  ro.fetch_threads = o.fetch_threads;
  // Warm every store: the first request computes and places every chunk,
  // the second reads them back (promotions included); both untimed.
  const std::vector<const char*> chunks = req.chunk_ptrs();
  cb_rag_stats st;
  for (auto& s : stores)
    for (int w = 0; w < 2; ++w) {
      ro.mode = CB_MODE_BLEND;
      set_ratio(ro, o.ratios.front());
      rag_prefill(session, s->cache, chunks, req.question, ro, st);
      check(cb_chunk_cache_flush(s->cache.h), "cannot flush the chunk cache");
    }

  std::vector<TierRow> rows = plan_rows(stores, o.modes, o.ratios);
  time_rows(o, stores, session, req, ro, rows);
  const std::vector<TierOut> outs = compare_rows(stores, rows);
  const TiersReport report{c, o, t, model, rows, outs};
  if (c.json)
    print_tiers_json(report);
  else
    print_tiers_table(report);
  if (!o.plot.empty()) plot_tiers(report, stores);
  return 0;
}

}  // namespace cbbench
