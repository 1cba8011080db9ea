// The C API of chunk caches and retrieval-augmented prefill: translation and
// checks only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "api.h"
#include "cacheblend/cacheblend_experimental.h"
#include "platform/cancel.h"
#include "runtime/blend/blend_options.h"
#include "runtime/blend/rag_call.h"
#include "runtime/blend/rag_request.h"
#include "runtime/sampler.h"

using namespace cb::api;

namespace {

// The fields of cb_rag_options that decide a chunk's cache key.  One parser
// for cb_rag_prefill, cb_chunk_cache_add and cb_chunk_cache_contains, so an
// ingest step and a later request always agree on the key.
struct ChunkKeyOptions {
  cb::ChunkHead head = cb::ChunkHead::kPrompt;
  std::string system_prompt;
  std::string ns;
};

constexpr const char* kDefaultSystemPrompt = "Answer the question using the documents.";

ChunkKeyOptions chunk_key_options(const cb_rag_options& o) {
  ChunkKeyOptions k;
  switch (enum_value(o.chunk_head)) {
    case CB_CHUNK_HEAD_PROMPT:
      k.head = cb::ChunkHead::kPrompt;
      break;
    case CB_CHUNK_HEAD_NONE:
      k.head = cb::ChunkHead::kNone;
      break;
    default:
      invalid("unknown chunk_head value (use a cb_chunk_head)");
  }
  k.system_prompt = o.system_prompt != nullptr ? o.system_prompt : kDefaultSystemPrompt;
  if (o.cache_namespace != nullptr) k.ns = o.cache_namespace;
  return k;
}

cb_rag_options read_rag_options(const cb_rag_options* opts) {
  return read_options(opts, cb_rag_options_init_sized, offsetof(cb_rag_options, select),
                      "cb_rag_options.struct_size is not a known size (use cb_rag_options_init)");
}

// A chunk as cb_rag_prefill would see it: its tokens, the tokens its KV is
// computed after, and its cache key.
struct ChunkEntry {
  std::vector<int32_t> tokens;
  std::vector<int32_t> head;
  cb::cache::ChunkKey key;
};

ChunkEntry chunk_entry(const cb::Model& model, const char* chunk_text, const cb_rag_options* opts) {
  const ChunkKeyOptions ko = chunk_key_options(read_rag_options(opts));
  ChunkEntry e;
  e.tokens = cb::rag_chunk_tokens(model.tokenizer(), chunk_text);
  e.head = cb::chunk_head_tokens(
      ko.head, cb::rag_prompt_head(model.tokenizer(), model.chat_format(), ko.system_prompt));
  e.key = cb::chunk_cache_key(model, ko.head, e.head, e.tokens, ko.ns);
  return e;
}

// cb_chunk_cache_add, and with a context cb_chunk_cache_add_after: the
// chunk's KV computed after its chunk head (and the context's tokens), and
// stored under the chunk's key (with a context, cb::after_context_key of
// it); without a context only when missing.
void add_chunk(cb_session* session, cb_chunk_cache* cache, const char* chunk_text,
               const char* context_text, const cb_rag_options* opts, int32_t* out_computed,
               int32_t* out_n_tokens) {
  SessionUse use(session);
  check_cache(cache);
  require(session->generator->n_past() == 0,
          "the session is not empty (reset the session first with cb_session_reset)");
  cb::Session& s = *session->session;
  const ChunkEntry e = chunk_entry(*session->state->model, chunk_text, opts);
  std::vector<int32_t> head = e.head;
  if (context_text != nullptr) {
    const std::vector<int32_t> context =
        cb::rag_chunk_tokens(session->state->model->tokenizer(), context_text);
    head.insert(head.end(), context.begin(), context.end());
  }
  const int64_t n_ctx = s.n_ctx();
  const int64_t len = static_cast<int64_t>(e.tokens.size());
  const int64_t head_len = static_cast<int64_t>(head.size());
  if (len + head_len > n_ctx)
    throw cb::Error(
        cb::ErrorCode::kContextOverflow,
        "the chunk is " + std::to_string(len) + " tokens long" +
            (head_len > 0 ? " (plus a " + std::to_string(head_len) + "-token chunk head" +
                                (context_text != nullptr ? " and context)" : ")")
                          : std::string()) +
            ", more than the session's context of " + std::to_string(n_ctx) + " tokens");
  int32_t computed = 0;
  // The session's abort check also ends a wait on a slow storage tier.
  cb::ScopedCancelCheck cancel(s.stop_check() ? *s.stop_check() : cb::StopCheck());
  // rag_prefill skips empty chunks, so there is nothing to store for one
  // (the trailing blank line makes that impossible today).
  if (!e.tokens.empty() &&
      (context_text != nullptr ||
       !cache->impl->kv().find(e.key, cb::chunk_kv_shape(s.model(), e.tokens.size())))) {
    session->generator->forget_logits();
    cb::cache::ChunkKV kv;
    try {
      // With storage tiers, placement learns the model's compute cost
      // first (a probe in this empty session, once per model).
      cache->impl->prepare_placement(s, session->n_threads);
      kv = cb::precompute_chunk_kv(s, head, e.tokens);
    } catch (...) {
      s.truncate(0);  // the session is left empty whatever happened
      throw;
    }
    if (context_text != nullptr) {
      cache->impl->add(cb::after_context_key(e.key), std::move(kv));
      cache->impl->set_neighbour_kv(true);
    } else {
      cache->impl->add(e.key, std::move(kv));
    }
    computed = 1;
  }
  if (out_computed != nullptr) *out_computed = computed;
  if (out_n_tokens != nullptr) *out_n_tokens = clamp_i32(len);
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------
// Retrieval-augmented prefill

cb_status cb_chunk_cache_create(cb_chunk_cache** out_cache) {
  return guard("cb_chunk_cache_create", [&] {
    require(out_cache != nullptr, "out_cache is NULL");
    auto cache = std::make_unique<cb_chunk_cache>();
    cache->impl = std::make_unique<cb::ChunkCache>();
    live_handles().add(HandleKind::kCache, cache.get());
    *out_cache = cache.release();
    return CB_OK;
  });
}

void cb_store_options_init_sized(cb_store_options* opts, size_t struct_size) {
  cb_store_options d;
  std::memset(static_cast<void*>(&d), 0, sizeof(d));
  const cb::cache::StoreOptions store;
  d.capacity_bytes = store.capacity_bytes;
  d.codec = static_cast<cb_codec>(store.codec);
  d.read_bytes_per_sec = store.read_bytes_per_sec;
  d.busy_timeout_ms = store.busy_timeout_ms;
  d.redis_timeout_ms = cb::cache::RedisOptions{}.command_timeout_ms;
  d.placement_ratio = cb::kDefaultRatio;
  write_defaults(opts, d, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_store_options_init(cb_store_options* opts) {
  cb_store_options_init_sized(opts, offsetof(cb_store_options, ram_budget_bytes));
}

cb_status cb_chunk_cache_open(const char* dir, const cb_store_options* opts,
                              cb_chunk_cache** out_cache) {
  return guard("cb_chunk_cache_open", [&] {
    require(out_cache != nullptr, "out_cache is NULL");
    *out_cache = nullptr;
    require(dir != nullptr && *dir != '\0', "dir is NULL or empty");
    cb_store_options o;
    cb_store_options_init_sized(&o, sizeof(o));
    if (opts != nullptr) {
      // Callers built before assumed_read_bytes_per_sec existed pass a
      // smaller struct: still valid, the new field keeps its default.
      const size_t size = output_size(
          opts, offsetof(cb_store_options, assumed_read_bytes_per_sec),
          "cb_store_options.struct_size is not a known size (use cb_store_options_init)");
      std::memcpy(static_cast<void*>(&o), opts, size);
    }
    const int codec = enum_value(o.codec);
    require(codec == CB_CODEC_F16 || codec == CB_CODEC_Q8 || codec == CB_CODEC_Q4,
            "unknown codec (use CB_CODEC_F16, CB_CODEC_Q8 or CB_CODEC_Q4)");
    require(o.capacity_bytes > 0, "capacity_bytes must be positive");
    require(o.busy_timeout_ms >= 0, "busy_timeout_ms must not be negative");
    require(std::isfinite(o.assumed_read_bytes_per_sec) && o.assumed_read_bytes_per_sec >= 0.0,
            "assumed_read_bytes_per_sec must be a finite number >= 0");
    cb::cache::StoreOptions so;
    so.capacity_bytes = o.capacity_bytes;
    so.codec = static_cast<cb::cache::Codec>(codec);
    so.read_bytes_per_sec = o.read_bytes_per_sec;
    so.busy_timeout_ms = o.busy_timeout_ms;
    cb::ChunkCacheTiers tiers;
    tiers.ram_budget_bytes = o.ram_budget_bytes;
    if (o.slow_dir != nullptr) {
      require(*o.slow_dir != '\0', "slow_dir is empty (NULL: no slow tier)");
      tiers.slow_dir = o.slow_dir;
    }
    tiers.slow_read_bytes_per_sec = o.slow_read_bytes_per_sec;
    require(
        std::isfinite(o.placement_ratio) && o.placement_ratio >= 0.0f && o.placement_ratio <= 1.0f,
        "placement_ratio must be in [0, 1]");
    tiers.placement_ratio = o.placement_ratio;
    if (o.redis_address != nullptr) {
      require(o.redis_timeout_ms > 0, "redis_timeout_ms must be positive");
      cb::cache::RedisOptions ro;
      ro.codec = so.codec;
      cb::cache::parse_redis_address(o.redis_address, ro);  // kInvalidArgument names the problem
      if (o.redis_password != nullptr) ro.password = o.redis_password;
      if (o.redis_username != nullptr) ro.username = o.redis_username;
      ro.connect_timeout_ms = ro.command_timeout_ms = o.redis_timeout_ms;
      tiers.redis = ro;
    } else {
      require(o.redis_password == nullptr && o.redis_username == nullptr,
              "redis_password or redis_username set without redis_address");
    }
    auto cache = std::make_unique<cb_chunk_cache>();
    cache->impl = std::make_unique<cb::ChunkCache>(dir, so, o.assumed_read_bytes_per_sec, tiers);
    live_handles().add(HandleKind::kCache, cache.get());
    *out_cache = cache.release();
    return CB_OK;
  });
}

cb_status cb_chunk_cache_flush(cb_chunk_cache* cache) {
  return guard("cb_chunk_cache_flush", [&] {
    check_cache(cache);
    cache->impl->flush();
    return CB_OK;
  });
}

void cb_chunk_cache_free(cb_chunk_cache* cache) {
  if (cache == nullptr || !live_handles().remove(HandleKind::kCache, cache)) return;
  delete cache;  // pending writes finish first (cb::ChunkCache's destructor)
}

void cb_chunk_cache_stats_init_sized(cb_chunk_cache_stats* stats, size_t struct_size) {
  write_zeros(stats, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_chunk_cache_stats_init(cb_chunk_cache_stats* stats) {
  cb_chunk_cache_stats_init_sized(stats, sizeof(cb_chunk_cache_stats));
}

cb_status cb_chunk_cache_get_stats(const cb_chunk_cache* cache, cb_chunk_cache_stats* stats) {
  return guard("cb_chunk_cache_get_stats", [&] {
    check_cache(cache);
    // Callers built before `quarantined` existed pass a shorter struct.
    const size_t size = output_size(
        stats, offsetof(cb_chunk_cache_stats, quarantined),
        "stats is NULL or stats->struct_size is not a known size (use cb_chunk_cache_stats_init)");
    cb_chunk_cache_stats out;
    cb_chunk_cache_stats_init_sized(&out, sizeof(out));
    const cb::cache::StoreStats st = cache->impl->stats();
    out.n_entries = st.entries;
    out.bytes = st.bytes;
    out.hits = st.hits;
    out.misses = st.misses;
    out.evictions = st.evictions;
    out.corrupt_drops = st.corrupt_drops;
    out.bytes_read = st.bytes_read;
    out.quarantined = st.quarantined;
    out.unavailable_tiers = static_cast<uint32_t>(cache->impl->unavailable_tiers());
    out.read_only = st.read_only ? 1 : 0;
    std::memcpy(static_cast<void*>(stats), &out, size);
    stats->struct_size = size;
    return CB_OK;
  });
}

cb_status cb_chunk_cache_open_report(const cb_chunk_cache* cache, char* buf, size_t capacity,
                                     size_t* out_len) {
  return guard("cb_chunk_cache_open_report", [&] {
    check_cache(cache);
    require(out_len != nullptr, "out_len is NULL");
    return write_text(cache->impl->open_report(), buf, capacity, out_len);
  });
}

void cb_tier_stats_init_sized(cb_tier_stats* stats, size_t struct_size) {
  write_zeros(stats, struct_size);
}

cb_status cb_chunk_cache_n_tiers(const cb_chunk_cache* cache, size_t* out_n_tiers) {
  return guard("cb_chunk_cache_n_tiers", [&] {
    check_cache(cache);
    require(out_n_tiers != nullptr, "out_n_tiers is NULL");
    *out_n_tiers = cache->impl->tier_stats().tiers.size();
    return CB_OK;
  });
}

namespace {

// The tier names a cache builds, as static strings for cb_tier_stats.name.
const char* static_tier_name(const std::string& name) {
  for (const char* n : {"ram", "flash", "slow", "redis"})
    if (name == n) return n;
  return "other";
}

}  // namespace

cb_status cb_chunk_cache_get_tier_stats(const cb_chunk_cache* cache, size_t tier,
                                        cb_tier_stats* stats) {
  return guard("cb_chunk_cache_get_tier_stats", [&] {
    check_cache(cache);
    const size_t size = output_size(
        stats, sizeof(cb_tier_stats),
        "stats is NULL or stats->struct_size is not a known size (use cb_tier_stats_init)");
    const cb::cache::TieredStats all = cache->impl->tier_stats();
    if (tier >= all.tiers.size())
      throw cb::Error(cb::ErrorCode::kInvalidArgument,
                      "tier " + std::to_string(tier) + " does not exist (the cache has " +
                          std::to_string(all.tiers.size()) + " tier(s))");
    const cb::cache::TierStats& t = all.tiers[tier];
    cb_tier_stats out;
    cb_tier_stats_init_sized(&out, sizeof(out));
    out.name = static_tier_name(t.name);
    out.hits = t.hits;
    out.misses = t.misses;
    out.bytes_read = t.bytes_read;
    out.read_failures = t.read_failures;
    out.placed = t.placed;
    out.promoted_in = t.promoted_in;
    out.demoted_in = t.demoted_in;
    out.failures = t.failures;
    out.budget_bytes = t.budget_bytes;
    std::memcpy(static_cast<void*>(stats), &out, size);
    stats->struct_size = size;
    return CB_OK;
  });
}

cb_status cb_chunk_cache_clear(cb_chunk_cache* cache) {
  return guard("cb_chunk_cache_clear", [&] {
    check_cache(cache);
    cache->impl->clear();
    return CB_OK;
  });
}

const char* cb_mode_name(cb_mode mode) {
  switch (enum_value(mode)) {
    case CB_MODE_FULL:
      return "full";
    case CB_MODE_PREFIX:
      return "prefix";
    case CB_MODE_REUSE:
      return "reuse";
    case CB_MODE_BLEND:
      return "blend";
  }
  return "unknown";
}

}  // extern "C"

namespace {

// The runtime's policy for a cb_select value; none for values outside the
// enum (read through enum_value, by reference: a caller may have stored any
// int there).
std::optional<cb::Selection> selection_of(const cb_select& select) {
  switch (enum_value(select)) {
    case CB_SELECT_DEFAULT:
      return cb::default_selection();
    case CB_SELECT_HKVD:
      return cb::Selection::kHkvd;
    case CB_SELECT_HKVD_KV:
      return cb::Selection::kHkvdKv;
    case CB_SELECT_ATTENTION:
      return cb::Selection::kAttention;
    case CB_SELECT_LOOKAHEAD:
      return cb::Selection::kLookahead;
    case CB_SELECT_RANDOM:
      return cb::Selection::kRandom;
    case CB_SELECT_ORACLE:
      return cb::Selection::kOracle;
    case CB_SELECT_ORACLE_KL:
      return cb::Selection::kOracleKl;
  }
  return std::nullopt;
}

}  // namespace

extern "C" {

const char* cb_select_name(cb_select select) {
  const std::optional<cb::Selection> s = selection_of(select);
  return s ? cb::selection_name(*s) : "unknown";
}

void cb_rag_options_init_sized(cb_rag_options* opts, size_t struct_size) {
  cb_rag_options d;
  std::memset(static_cast<void*>(&d), 0, sizeof(d));
  d.mode = CB_MODE_BLEND;
  d.ratio = cb::kDefaultRatio;
  d.schedule = nullptr;
  d.n_schedule = 0;
  d.chunk_head = CB_CHUNK_HEAD_PROMPT;
  d.system_prompt = nullptr;
  d.cache_namespace = nullptr;
  d.pipeline = 1;
  d.auto_ratio = 0;
  d.select = CB_SELECT_DEFAULT;
  d.sink_tokens = 0;
  d.seed = 0;
  d.guard_share = 0.0f;
  d.guard_max_ratio = 0.5f;
  d.chunk_shift = cb::kDefaultChunkShift ? 1 : 0;
  d.shift_probes = cb::kDefaultShiftProbes;
  d.shift_span = static_cast<int32_t>(cb::kDefaultShiftSpan);
  d.fetch_threads = 0;
  write_defaults(opts, d, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_rag_options_init(cb_rag_options* opts) {
  cb_rag_options_init_sized(opts, offsetof(cb_rag_options, chunk_shift));
}

cb_status cb_chunk_cache_add(cb_session* session, cb_chunk_cache* cache, const char* chunk_text,
                             const cb_rag_options* opts, int32_t* out_computed,
                             int32_t* out_n_tokens) {
  return guard("cb_chunk_cache_add", [&] {
    require(chunk_text != nullptr, "chunk_text is NULL");
    add_chunk(session, cache, chunk_text, nullptr, opts, out_computed, out_n_tokens);
    return CB_OK;
  });
}

cb_status cb_chunk_cache_add_after(cb_session* session, cb_chunk_cache* cache,
                                   const char* chunk_text, const char* context_text,
                                   const cb_rag_options* opts, int32_t* out_n_tokens) {
  return guard("cb_chunk_cache_add_after", [&] {
    require(chunk_text != nullptr, "chunk_text is NULL");
    require(context_text != nullptr, "context_text is NULL");
    add_chunk(session, cache, chunk_text, context_text, opts, nullptr, out_n_tokens);
    return CB_OK;
  });
}

cb_status cb_chunk_cache_set_neighbour_kv(cb_chunk_cache* cache, int32_t enabled) {
  return guard("cb_chunk_cache_set_neighbour_kv", [&] {
    check_cache(cache);
    require(enabled == 0 || enabled == 1, "enabled must be 0 or 1");
    cache->impl->set_neighbour_kv(enabled == 1);
    return CB_OK;
  });
}

cb_status cb_chunk_cache_set_context_scale(cb_chunk_cache* cache, float scale) {
  return guard("cb_chunk_cache_set_context_scale", [&] {
    check_cache(cache);
    require(scale >= cb::kMinContextScale && scale <= cb::kMaxContextScale,
            "context scale is outside [0.01, 100] (or not a number)");
    cache->impl->set_context_scale(scale);
    return CB_OK;
  });
}

namespace {

// Whether `cache` holds the chunk's KV computed alone (after_context false)
// or after a context.
cb_status chunk_cache_lookup(const char* fn, const cb_model* model, cb_chunk_cache* cache,
                             const char* chunk_text, const cb_rag_options* opts, bool after_context,
                             int32_t* out_found) {
  return guard(fn, [&] {
    const cb::Model& m = model_of(model);
    check_cache(cache);
    require(chunk_text != nullptr, "chunk_text is NULL");
    require(out_found != nullptr, "out_found is NULL");
    const ChunkEntry e = chunk_entry(m, chunk_text, opts);
    const cb::cache::ChunkKey key = after_context ? cb::after_context_key(e.key) : e.key;
    *out_found = !e.tokens.empty() && cache->impl->kv().find(
                                          key, cb::chunk_kv_shape(m, e.tokens.size())) != nullptr
                     ? 1
                     : 0;
    return CB_OK;
  });
}

}  // namespace

cb_status cb_chunk_cache_contains(const cb_model* model, cb_chunk_cache* cache,
                                  const char* chunk_text, const cb_rag_options* opts,
                                  int32_t* out_found) {
  return chunk_cache_lookup("cb_chunk_cache_contains", model, cache, chunk_text, opts, false,
                            out_found);
}

cb_status cb_chunk_cache_contains_after(const cb_model* model, cb_chunk_cache* cache,
                                        const char* chunk_text, const cb_rag_options* opts,
                                        int32_t* out_found) {
  return chunk_cache_lookup("cb_chunk_cache_contains_after", model, cache, chunk_text, opts, true,
                            out_found);
}

cb_status cb_chunk_cache_remove(const cb_model* model, cb_chunk_cache* cache,
                                const char* chunk_text, const cb_rag_options* opts,
                                int32_t* out_removed) {
  return guard("cb_chunk_cache_remove", [&] {
    const cb::Model& m = model_of(model);
    check_cache(cache);
    require(chunk_text != nullptr, "chunk_text is NULL");
    const ChunkEntry e = chunk_entry(m, chunk_text, opts);
    bool removed = false;
    if (!e.tokens.empty()) {
      removed = cache->impl->kv().remove(e.key);
      // The KV computed after a context (cb_chunk_cache_add_after) goes too.
      removed = cache->impl->kv().remove(cb::after_context_key(e.key)) || removed;
    }
    if (out_removed != nullptr) *out_removed = removed ? 1 : 0;
    return CB_OK;
  });
}

void cb_rag_stats_init_sized(cb_rag_stats* stats, size_t struct_size) {
  write_zeros(stats, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_rag_stats_init(cb_rag_stats* stats) {
  cb_rag_stats_init_sized(stats, sizeof(cb_rag_stats));
}

cb_status cb_rag_prefill(cb_session* session, cb_chunk_cache* cache, const char* const* chunk_texts,
                         size_t n_chunks, const char* question, const cb_rag_options* opts,
                         cb_rag_stats* stats) {
  return guard("cb_rag_prefill", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    SessionUse use(session);
    require(chunk_texts != nullptr || n_chunks == 0, "chunk_texts is NULL");
    require(n_chunks > 0,
            "no chunks: a request without documents is a plain prompt (use cb_generate)");
    for (size_t i = 0; i < n_chunks; ++i)
      if (chunk_texts[i] == nullptr)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "chunk_texts[" + std::to_string(i) + "] is NULL");
    require(question != nullptr, "question is NULL");
    const size_t stats_size =
        stats == nullptr
            ? 0
            : output_size(stats, offsetof(cb_rag_stats, upload_ms),
                          "stats->struct_size is not a known size (use cb_rag_stats_init)");
    const cb_rag_options o = read_rag_options(opts);
    require(o.schedule != nullptr || o.n_schedule == 0, "schedule is NULL but n_schedule is not 0");
    require(session->generator->n_past() == 0,
            "the session is not empty (reset the session first with cb_session_reset)");

    cb::RagCall call;
    cb::RagPrefillOptions& ro = call.options;
    switch (enum_value(o.mode)) {
      case CB_MODE_FULL:
        ro.blend.mode = cb::BlendMode::kFull;
        break;
      case CB_MODE_PREFIX:
        ro.blend.mode = cb::BlendMode::kPrefix;
        break;
      case CB_MODE_REUSE:
        ro.blend.mode = cb::BlendMode::kReuse;
        break;
      case CB_MODE_BLEND:
        ro.blend.mode = cb::BlendMode::kBlend;
        break;
      default:
        invalid("unknown mode value (use a cb_mode)");
    }
    const ChunkKeyOptions key_opts = chunk_key_options(o);
    ro.chunk_head = key_opts.head;
    ro.ns = key_opts.ns;
    const std::optional<cb::Selection> selection = selection_of(o.select);
    require(selection.has_value(), "unknown select value (use a cb_select)");
    ro.blend.selection = *selection;
    ro.blend.sink_tokens = o.sink_tokens;
    ro.blend.seed = o.seed;
    ro.blend.guard_share = o.guard_share;
    ro.blend.guard_max_ratio = o.guard_max_ratio;
    require(o.chunk_shift == 0 || o.chunk_shift == 1, "chunk_shift must be 0 or 1");
    ro.blend.chunk_shift = o.chunk_shift != 0;
    require(o.shift_probes >= 0.0f && o.shift_probes <= 1.0f, "shift_probes must be in [0, 1]");
    ro.blend.shift_probes = o.shift_probes;
    require(o.shift_span >= 0 && o.shift_span <= (1 << 20), "shift_span must be in [0, 1048576]");
    ro.blend.shift_span = o.shift_span;
    ro.blend.schedule.clear();  // none given: the runtime's single check at `ratio`
    for (size_t i = 0; i < o.n_schedule; ++i)
      ro.blend.schedule.push_back({o.schedule[i].layer, o.schedule[i].ratio});
    ro.pipeline.enabled = o.pipeline != 0;
    require(o.fetch_threads >= 0 && o.fetch_threads <= 64, "fetch_threads must be in [0, 64]");
    ro.pipeline.fetch_threads = o.fetch_threads;
    if (cache != nullptr) check_cache(cache);
    std::vector<std::string> texts(chunk_texts, chunk_texts + n_chunks);
    call.chunk_texts = texts;
    call.question = question;
    call.system_prompt = key_opts.system_prompt;
    call.ratio = o.ratio;
    call.auto_ratio = o.auto_ratio != 0;
    call.n_threads = session->n_threads;

    session->generator->forget_logits();
    const cb::RagCallResult r =
        cb::run_rag_call(*session->session, cache != nullptr ? cache->impl.get() : nullptr, call);
    const double total_ms = ms_since(t0);
    session->generator->set_logits(r.logits, total_ms);

    if (stats != nullptr) {
      const cb::RagPrefillStats& rs = r.stats;
      cb_rag_stats out;
      cb_rag_stats_init_sized(&out, sizeof(out));
      out.n_tokens = clamp_i32(rs.fusion.n_tokens);
      out.n_reused = clamp_i32(rs.fusion.n_reused);
      out.cache_hits = clamp_i32(rs.cache_hits);
      out.cache_misses = clamp_i32(rs.cache_misses);
      out.chunks_recomputed = clamp_i32(rs.fusion.chunks_recomputed);
      out.precompute_ms = rs.precompute_ms;
      out.fuse_ms = rs.fusion.compute_ms;
      out.computed_fraction = rs.fusion.computed_fraction();
      out.ratio = r.ratio;
      out.pipelined = rs.fusion.pipelined ? 1 : 0;
      out.bytes_read = rs.fusion.bytes_read;
      out.load_ms = rs.fusion.load_ms;
      out.blocked_ms = rs.fusion.blocked_ms;
      out.recompute_ms = rs.fusion.recompute_ms;
      out.upload_ms = rs.fusion.upload_ms;
      out.selected_share = rs.fusion.selected_share;
      out.guard_raised = rs.fusion.guard_raised ? 1 : 0;
      out.fetch_ms = rs.fusion.fetch_ms;
      out.resident_hits = clamp_i32(rs.resident_hits);
      out.resident_bytes = rs.fusion.resident_bytes;
      out.total_ms = total_ms;
      std::memcpy(static_cast<void*>(stats), &out, stats_size);
      stats->struct_size = stats_size;
    }
    return CB_OK;
  });
}

}  // extern "C"
