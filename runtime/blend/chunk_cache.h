// The chunk cache of a RAG app: where its chunks' KV lives (in RAM, or in the
// chunk-KV store on flash) and, on flash, what the loading controller has
// learnt per device and model, persisted beside the store.  The C API's
// cb_chunk_cache is one of these.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "cache/chunk_store.h"
#include "cache/flash_chunk_store.h"
#include "cache/flash_store.h"
#include "cache/redis_store.h"
#include "cache/tiered_chunk_store.h"
#include "cache/write_back_queue.h"
#include "runtime/blend/calibration.h"
#include "runtime/blend/loading_controller.h"
#include "runtime/blend/rag_request.h"
#include "runtime/blend/tier_placement.h"
#include "runtime/session.h"

namespace cb {

// Storage tiers around the store on flash (tiered_chunk_store.h): all off by
// default.  New chunks are placed for `placement_ratio` with the compute
// model of their model on this device: the one the loading controller
// measures (a short probe in the caller's session the first time a model
// puts a chunk, then kept in DIR/calibration.sqlite).  The Redis tier is
// shared: every new chunk is also written there, for other devices.
struct ChunkCacheTiers {
  uint64_t ram_budget_bytes = 0;         // > 0: a RAM tier (decoded f32 bytes) before flash
  std::string slow_dir;                  // a slower directory after flash (an SD card); "": none
  uint64_t slow_read_bytes_per_sec = 0;  // its read cap; 0: none
  std::optional<cache::RedisOptions> redis;  // a Redis server as the last tier
  double placement_ratio = kDefaultRatio;    // the recompute ratio new chunks are placed for
  bool any() const { return ram_budget_bytes > 0 || !slow_dir.empty() || redis.has_value(); }
};

class ChunkCache {
 public:
  // In RAM.
  ChunkCache();
  // In the chunk-KV store at `dir` (created if missing).  A positive
  // assumed_read_bytes_per_sec pins the store's read speed for the loading
  // controller; 0 lets it be measured.  A slow directory that cannot be
  // used (not a directory, not writable) is skipped: counted in
  // unavailable_tiers() and said in open_report().
  ChunkCache(const std::string& dir, const cache::StoreOptions& opts,
             double assumed_read_bytes_per_sec, const ChunkCacheTiers& tiers = {});
  // Pending store writes and calibration saves finish first; a failure
  // then has nowhere to go, and what it concerns is simply absent.
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  cache::ChunkStore& kv() {
    if (tiered_) return *tiered_;
    return flash_ ? static_cast<cache::ChunkStore&>(*flash_) : table_;
  }
  // The tiers around the store on flash; null without tiers.
  const cache::TieredChunkStore* tiers() const { return tiered_.get(); }
  // The store on flash; null in RAM.
  cache::FlashStore* store() { return flash_ ? &flash_->store() : nullptr; }
  const cache::FlashStore* store() const { return flash_ ? &flash_->store() : nullptr; }
  // Entries and bytes; on flash the store's whole statistics (with tiers:
  // the flash tier's).
  cache::StoreStats stats() const;
  // What the open found that a user should hear about, one line each ('\n'
  // after each): stores opened read-only, quarantined chunks, tiers skipped
  // (FlashStore::open_report).  Empty: nothing.
  const std::string& open_report() const { return open_report_; }
  // Configured tiers that could not be opened and were skipped.
  int unavailable_tiers() const { return unavailable_tiers_; }
  // Per tier, fastest first: with tiers, the tiered store's counters; on
  // flash alone, one tier "flash" (hits, misses, bytes read); in RAM, none.
  cache::TieredStats tier_stats() const;

  // With tiers: gives placement the compute model of the session's model
  // on this device (measured by a short probe in `s`, which must be empty,
  // the first time; kept beside the store), once per model.  A no-op
  // without tiers.
  void prepare_placement(Session& s, int n_threads);
  // Stores a chunk computed by an ingest step now (not queued: an ingest
  // adds many chunks quickly and must lose none to a full write-back
  // queue, and the chunk must be found right after).  With tiers, in the
  // tier placement picks (and the shared tier); throws cb::Error(kIo) when
  // no tier takes it.  Without tiers, in the store on flash (or in RAM).
  void add(const cache::ChunkKey& key, cache::ChunkKV kv);
  // Empties the tiers this cache holds itself (RAM, flash, the slow
  // directory).  The Redis tier is shared with other processes and devices
  // (their namespaces and models too) and is not cleared.
  void clear();
  // Returns once queued store writes and calibration saves are done.
  void flush();

  // A RAG prefill of `prompt` into the empty session `s` (runtime/blend/
  // rag_request.h), after checking every chunk and the whole request
  // against the context (kContextOverflow saying which).  With
  // `auto_ratio` (flash only) the loading controller of this device (named
  // from the backend and `n_threads`) and model picks the ratio, with
  // opts.min_ratio as its floor; it is calibrated by a short probe in `s` at
  // first use, and what it learns is saved beside the store off the path to
  // the first token.  Whatever fails, the session is left empty.
  std::span<const float> prefill(Session& s, const RagPrompt& prompt, RagPrefillOptions opts,
                                 bool auto_ratio, int n_threads, RagPrefillStats* stats);
  // BlendOptions::context_scale of every request through this cache (its
  // chunks' KV is what the scale corrects); validated by the request.
  void set_context_scale(float scale) { context_scale_ = scale; }
  // RagPrefillOptions::neighbour_kv of every request through this cache:
  // whether its store may hold KV computed after a context.
  void set_neighbour_kv(bool on) { neighbour_kv_ = on; }

 private:
  LoadingController& controller_for(Session& s, const std::string& device);
  void flush_redis();  // the Redis tier's queued writes, where there is one

  cache::RamChunkStore table_;
  std::shared_ptr<cache::FlashChunkStore> flash_;
  // With tiers: the stores besides flash, and the store over all of them.
  std::shared_ptr<cache::RamChunkStore> ram_tier_;
  std::shared_ptr<cache::FlashStore> slow_;
  std::shared_ptr<cache::RedisStore> redis_;  // null in a build without the Redis tier
  std::shared_ptr<TierPlacement> placement_;  // with tiers: where new chunks go
  std::unique_ptr<cache::TieredChunkStore> tiered_;
  double assumed_read_bytes_per_sec_ = 0.0;
  float context_scale_ = 1.0f;
  std::atomic<bool> neighbour_kv_{false};
  std::string open_report_;
  int unavailable_tiers_ = 0;
  std::mutex auto_mu_;  // serializes auto-ratio requests: the controller learns from each
  std::unique_ptr<CalibrationDb> calibration_db_;
  std::map<std::string, std::unique_ptr<LoadingController>> controllers_;
  // Calibration saves, one worker; declared last so that it finishes (and
  // stops) before the database closes.
  std::unique_ptr<cache::WriteBackQueue> saves_;
};

}  // namespace cb
