// The chunk KV store's own settings (its codec and size), what a corpus's KV
// costs in it, and the precompute that fills it: at ingest (--kv eager), in
// a detached low-priority process (--kv background, the `precompute`
// command), or never ahead of time (--kv lazy: a chunk's KV is computed when
// a question first retrieves it, and stored for the next one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "app.h"

namespace rag {

class CorpusDb;

// When chunk KV is computed.
enum class KvWhen { kEager, kLazy, kBackground };

std::optional<KvWhen> parse_kv_when(std::string_view s);
std::optional<cb_codec> parse_codec(std::string_view s);
const char* codec_name(cb_codec c);

// The store's settings (defaults for what was never recorded).
KvStoreSettings load_kv_settings(CorpusDb& db);
void save_kv_settings(CorpusDb& db, const KvStoreSettings& s);

// Bytes of stored KV per token of text for `model` in `codec`: exact for
// f16, the measured zstd-compressed ratio for q8 (0.463) and q4 (0.285).
double kv_bytes_per_token(const Model& model, cb_codec codec);

// "12.3 MB" / "1.20 GB" (binary units).
std::string size_text(double bytes);

// Computes and stores the KV of every chunk of `db` that `cache` lacks,
// and with common.kv.neighbours its KV after its nearest chunk
// (nearest_chunk in retrieval.h) where that is missing, with progress on
// stderr.  Returns what it computed.
struct PrecomputeTotals {
  size_t chunks = 0;            // computed alone
  size_t neighbour_chunks = 0;  // computed after their neighbour
  size_t tokens = 0;            // every token computed, the neighbours' included
};
// `ro`: the request options of the store's chunks (base_rag_options with the
// store's system prompt), which make their cache keys.
PrecomputeTotals precompute_missing(const CommonOptions& common, const Model& model, CorpusDb& db,
                                    ChunkCache& cache, const cb_rag_options& ro);

// What the store lacks: the chunks without KV and their tokens.
struct MissingKv {
  size_t chunks = 0;
  size_t tokens = 0;
  size_t all_tokens = 0;  // every chunk's, computed or not
  // With `neighbours`: the chunks without KV computed after a neighbour.
  size_t neighbour_chunks = 0;
};
MissingKv missing_kv(const Model& model, CorpusDb& db, ChunkCache& cache, const cb_rag_options& ro,
                     bool neighbours);

// Warns (stderr) when the whole corpus's KV would not fit the store, with
// the sizes and the ways out.
void warn_if_over_capacity(const Model& model, const KvStoreSettings& s, const MissingKv& m);

// `rag_assistant precompute`: the missing KV, under the store's lock (one
// precompute per store at a time; a second one exits saying so).
int run_precompute(const CommonOptions& common);

// Starts `precompute` as a detached process at idle priority, its output in
// DIR/precompute.log.  Returns its pid.
long start_background_precompute(const CommonOptions& common);

std::string precompute_log_path(const std::string& store);

}  // namespace rag
