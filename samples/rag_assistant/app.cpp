#include "app.h"

#include <cacheblend/cacheblend_experimental.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "model_path.h"
#include "printable.h"
#include "store_settings.h"
#include "tier_stats.h"

namespace rag {
namespace {

// The system turn of every request, unless the store records another
// (ingest --system).  It is part of the prompt head, so it is part of the
// cache key of every chunk: a different one makes the precomputed KV
// unreachable (the next ingest computes it again).  A short instruction:
// the small models this app runs (the default, Qwen2.5-Coder 1.5B, and the
// 135M test model) answer from the documents with it, and longer ones
// about style made the 135M model's answers worse in our trials.
constexpr const char* kSystemPrompt = "Answer the question using the documents.";

// Chunks of rag_assistant live in their own namespace so that another app
// sharing the store directory never gets them (nor they its chunks).
constexpr const char* kNamespace = "rag_assistant";

}  // namespace

void check(cb_status s, const std::string& what) {
  if (s == CB_OK) return;
  const char* detail = cb_last_error();
  throw Error(what + ": " + (detail[0] ? detail : cb_status_string(s)));
}

std::string resolve_model_path(const std::string& flag, const std::string& store) {
  try {
    return cbs::resolve_model_path(flag, recorded_model_path(store));
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

void load_model(const CommonOptions& o, Model& model) {
  cb_model_options mo;
  cb_model_options_init(&mo);
  mo.n_threads = o.threads;
  check(cb_model_load(o.model_path.c_str(), &mo, &model.h),
        "cannot load the model '" + o.model_path + "'");
}

void open_chunk_cache(const CommonOptions& o, ChunkCache& cache) {
  cb_store_options so;
  cb_store_options_init(&so);
  so.codec = o.kv.codec;
  so.capacity_bytes = o.kv.capacity_bytes;
  const TierOptions& t = o.tiers;
  so.ram_budget_bytes = t.ram_budget_bytes;
  if (!t.slow_dir.empty()) so.slow_dir = t.slow_dir.c_str();
  so.slow_read_bytes_per_sec = t.slow_read_bytes_per_sec;
  if (!t.redis_address.empty()) {
    so.redis_address = t.redis_address.c_str();
    if (!t.redis_password.empty()) so.redis_password = t.redis_password.c_str();
    if (!t.redis_username.empty()) so.redis_username = t.redis_username.c_str();
    if (t.redis_timeout_ms > 0) so.redis_timeout_ms = t.redis_timeout_ms;
  }
  if (t.placement_ratio >= 0.0f) so.placement_ratio = t.placement_ratio;
  check(cb_chunk_cache_open(kv_dir(o.store).c_str(), &so, &cache.h),
        "cannot open the chunk KV store in '" + kv_dir(o.store) + "'");
  if (o.kv.neighbours)
    check(cb_chunk_cache_set_neighbour_kv(cache.h, 1), "cannot use the store's neighbour KV");
  // What the open found (a store opened read-only, quarantined chunks, a
  // tier skipped) is said on stderr, and the command goes on.
  size_t n = 0;
  check(cb_chunk_cache_open_report(cache.h, nullptr, 0, &n), "cannot read the store's report");
  std::string report(n + 1, '\0');
  check(cb_chunk_cache_open_report(cache.h, report.data(), report.size(), &n),
        "cannot read the store's report");
  report.resize(n);
  for (size_t start = 0, end; (end = report.find('\n', start)) != std::string::npos;
       start = end + 1)
    warn(report.substr(start, end - start));
  cb_chunk_cache_stats st;
  cb_chunk_cache_stats_init(&st);
  check(cb_chunk_cache_get_stats(cache.h, &st), "cannot read the store's statistics");
  if (st.quarantined > 0) {
    const std::string command = "rag_assistant --store " + o.store + " ingest PATH...";
    warn("to compute the " + std::to_string(st.quarantined) +
         " quarantined chunk(s) again now instead, ingest the same files again: " + command);
  }
}

void warn(const std::string& message) {
  // Messages quote file names: printed escaped, one line each.
  std::fprintf(stderr, "rag_assistant: warning: %s\n", cbs::printable(message).c_str());
}

std::vector<cb_tier_stats> tier_stats(const ChunkCache& cache) {
  std::vector<cb_tier_stats> out;
  check(cbs::read_tier_stats(cache.h, out), "cannot read the storage tiers");
  return out;
}

void create_session(const Model& model, const CommonOptions& o, int n_ctx, Session& session) {
  cb_session_options so;
  cb_session_options_init(&so);
  so.n_threads = o.threads;
  so.n_ctx = n_ctx;
  so.kv_type = o.kv_type;
  check(cb_session_create(model.h, &so, &session.h), "cannot create a session");
}

int model_n_ctx_train(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  return info.n_ctx_train;
}

std::vector<int32_t> tokenize(const Model& model, std::string_view text) {
  size_t n = 0;
  // Document text is never parsed for control tokens, as cb_rag_prefill
  // does not: the counts must match what the request will hold.
  check(cb_tokenize(model.h, text.data(), text.size(), 0, 0, nullptr, 0, &n), "cannot tokenize");
  std::vector<int32_t> ids(n);
  if (n > 0)
    check(cb_tokenize(model.h, text.data(), text.size(), 0, 0, ids.data(), ids.size(), &n),
          "cannot tokenize");
  return ids;
}

std::string corpus_db_path(const std::string& store) {
  return store + "/corpus.sqlite";
}

std::string kv_dir(const std::string& store) {
  return store + "/kv";
}

const char* default_system_prompt() {
  return kSystemPrompt;
}

cb_rag_options base_rag_options(const std::string& system_prompt) {
  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = CB_CHUNK_HEAD_PROMPT;
  ro.system_prompt = system_prompt.c_str();
  ro.cache_namespace = kNamespace;
  return ro;
}

}  // namespace rag
