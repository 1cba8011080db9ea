// What every part of rag_assistant shares: errors, the C API handles with
// automatic cleanup, the store's layout and the request options that make a
// chunk's KV cache key (they must be identical at ingest and at ask time, or
// every precomputed chunk would be a cache miss).
#pragma once

#include <cacheblend/cacheblend.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "handles.h"

namespace rag {

// Throws an Error naming `what` and the library's message when s != CB_OK.
void check(cb_status s, const std::string& what);

using Model = cbs::ModelHandle;
using Session = cbs::SessionHandle;
using ChunkCache = cbs::ChunkCacheHandle;

// Storage tiers around the chunk KV store (cb_store_options): all off by
// default.
struct TierOptions {
  uint64_t ram_budget_bytes = 0;         // --ram-budget-mb
  std::string slow_dir;                  // --slow-dir
  uint64_t slow_read_bytes_per_sec = 0;  // --slow-read-mbps
  std::string redis_address;             // --redis
  std::string redis_password;            // --redis-password, else $CB_REDIS_PASSWORD
  std::string redis_username;            // --redis-user, else $CB_REDIS_USER
  int redis_timeout_ms = 0;              // --redis-timeout-ms; 0: the library's default
  float placement_ratio = -1.0f;         // --placement-ratio; < 0: the library's default
  bool any() const { return ram_budget_bytes > 0 || !slow_dir.empty() || !redis_address.empty(); }
};

// The chunk KV store's settings, kept in the store's corpus DB so that every
// command opens the store alike.  The codec is part of each chunk's cache
// key: changing it makes every stored chunk's KV unreachable (computed
// again; the old entries are evicted as space is needed).
struct KvStoreSettings {
  // q8 (int8 with a scale per token and head, then zstd) is 0.46x of f16;
  // q4 is 0.29x (samples/rag_assistant/README.md, "What it costs").
  static constexpr cb_codec kDefaultCodec = CB_CODEC_Q8;
  static constexpr uint64_t kDefaultCapacityBytes = uint64_t{4} << 30;
  cb_codec codec = kDefaultCodec;
  uint64_t capacity_bytes = kDefaultCapacityBytes;
  // Neighbour-aware precompute (--kv-neighbours): each chunk's KV is also
  // computed after its nearest chunk in the store (nearest_chunk), which
  // requests take where the chunk follows other chunks.  It costs about
  // three times the precompute and twice the KV, and has shown no gain on
  // the assistant's own requests yet (README, "Neighbour-aware
  // precompute").
  bool neighbours = false;
};

// Options every command understands.
struct CommonOptions {
  std::string store;            // --store DIR
  std::string model_path;       // resolve_model_path()'s
  int threads = 0;              // --threads, else the cores available to us
  int32_t kv_type = CB_KV_F16;  // --kv-type f16|f32
  TierOptions tiers;
  KvStoreSettings kv;  // the store's (load_kv_settings), not a flag
  // --system: the system prompt (ingest: the store's from now on; ask and
  // chat: this command's, instead of the store's).  Unset: the store's.
  std::optional<std::string> system_prompt;
};

// The model to load: `flag` (--model) when given, else $CB_MODEL, else the
// model the store's last ingest used while that file exists, else
// models/<default> under the current directory, else the same file in the
// source tree this binary was built from.  Throws an Error naming what was
// tried when none exists.
std::string resolve_model_path(const std::string& flag, const std::string& store);

// CPU cores this process may run on.
int available_cores();

void load_model(const CommonOptions& o, Model& model);
// Opens the chunk KV store with o's tiers and warns (on stderr) about what
// the open found: a store opened read-only, quarantined chunks, a tier
// skipped.
void open_chunk_cache(const CommonOptions& o, ChunkCache& cache);

// "rag_assistant: warning: MESSAGE" on stderr, control characters escaped.
void warn(const std::string& message);

// The chunk cache's storage tiers and their counters so far, fastest first
// (one, "flash", without tiers).
std::vector<cb_tier_stats> tier_stats(const ChunkCache& cache);
// A session of n_ctx tokens with o's threads and KV type.
void create_session(const Model& model, const CommonOptions& o, int n_ctx, Session& session);
int model_n_ctx_train(const Model& model);

std::vector<int32_t> tokenize(const Model& model, std::string_view text);

// The store directory's parts.
std::string corpus_db_path(const std::string& store);
std::string kv_dir(const std::string& store);

// The system prompt of a store that records none.
const char* default_system_prompt();

// The request options shared by ingest (precompute) and ask: chunk head,
// system prompt and namespace, i.e. everything in a chunk's cache key
// besides the model and the chunk's tokens.  `system_prompt` is the
// store's (store_system_prompt) and must outlive the options.  `mode` and
// ratio are the caller's to set.
cb_rag_options base_rag_options(const std::string& system_prompt);
// A temporary would leave the options pointing at freed text.
cb_rag_options base_rag_options(const std::string&& system_prompt) = delete;

}  // namespace rag
