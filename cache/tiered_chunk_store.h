// Chunk KV over an ordered list of storage tiers, fastest first: e.g. RAM
// with a byte budget, internal flash, a slower directory (an SD card), a
// Redis server shared by devices.  Each tier is a ChunkStore of its own.
//
//   find: the fastest tier holding the chunk serves it.  A tier that fails
//     (throws) is skipped and counted; the lookup falls through to the next.
//     A chunk served from a slower tier and read in full (every layer) is
//     promoted: the layers the fusor read are copied to the nearest tier
//     above that reads at least as fast (one tier up, unless that one is
//     slower), without reading anything twice (after promote_after_hits
//     such hits).  A tier whose budget is full admits it only if it was
//     read in full more often (by more than one read; by any, if never)
//     than that tier's least recently used chunk was hit there: a cyclic
//     working set larger than the budget does not churn it.
//   put: the chunk goes to the tier the options' ChunkPlacement picks (the
//     fastest without one; runtime/blend/tier_placement.h picks the
//     cheapest tier whose loads a blend still hides).  A tier
//     that fails passes the chunk to the next one down, and when none below
//     takes it, to the nearest one above.  A shared tier (a
//     server other devices read) also gets a copy of every chunk placed
//     above it, so that they find what this one computed.
//   budgets: a tier with capacity_bytes keeps to it (in decoded bytes, f32 K
//     and V): the least recently used chunks are demoted to the next tier
//     (plan_eviction picks them), or dropped from the last tier.  A
//     chunk larger than the budget goes to the next tier.  Tiers without a
//     budget keep to their own capacity (a FlashStore's LRU, a server's
//     maxmemory policy).
//
// Slower tiers keep their copy when a chunk is promoted (they are larger),
// so a demotion usually finds the chunk already there and writes nothing.
// Every tier returns the same KV for a chunk up to its codec (RAM: exact
// f32), so which tier serves a chunk changes speed, not the blend's output
// beyond that codec's rounding.
//
// Thread-safe.  Sources handed out stay valid after the store is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <span>

#include "cache/chunk_store.h"
#include "cache/storage_tier.h"

namespace cb::cache {

struct ChunkTier {
  // The tier's name (as the calibration names tiers), read speed (0: in RAM,
  // reads cost nothing) and cost rank (lower: cheaper per byte).  A tier the
  // calibration does not know is predicted from these.
  StorageTier cost;
  std::shared_ptr<ChunkStore> store;
  std::optional<Codec> codec;   // how the store keeps chunks; none: f32 in RAM
  uint64_t capacity_bytes = 0;  // decoded bytes this tier may hold; 0: no budget here
  // Written through: every chunk placed in a tier above is also put here
  // (a server that other processes and devices share).
  bool shared = false;
};

// Which tier a new chunk goes to.  The code that predicts load and compute
// times implements it (runtime/blend/tier_placement.h), so that storage
// knows nothing of how a request is computed.  Called from any thread.
class ChunkPlacement {
 public:
  virtual ~ChunkPlacement() = default;
  // The index in `tiers` (fastest first) of the tier for a new chunk of this
  // shape, of the model with this fingerprint.
  virtual size_t tier_for(const KvShape& shape, const std::string& model_fingerprint,
                          std::span<const ChunkTier> tiers) const = 0;
};

struct TieredChunkStoreOptions {
  std::shared_ptr<const ChunkPlacement> placement;  // null: new chunks go to the fastest tier
  int promote_after_hits = 1;  // full reads from a slower tier before a copy moves up
};

struct TierStats {
  std::string name;
  uint64_t hits = 0;           // finds this tier served
  uint64_t misses = 0;         // finds that reached this tier and did not find the chunk here
  uint64_t bytes_read = 0;     // stored bytes of the layers read from this tier
  uint64_t read_failures = 0;  // layer reads from this tier that failed (the chunk is computed)
  uint64_t placed = 0;         // new chunks put here (a shared tier: also those placed above)
  uint64_t promoted_in = 0;    // chunks copied here from the tier below
  uint64_t demoted_in = 0;     // chunks moved here from the tier above
  uint64_t dropped = 0;        // chunks removed for the budget with nowhere lower to go
  uint64_t failures = 0;       // finds and puts that threw
  uint64_t budget_bytes = 0;   // decoded bytes held against capacity_bytes
  std::string last_error;
};

struct TieredStats {
  std::vector<TierStats> tiers;  // in tier order
  uint64_t misses = 0;           // finds no tier could serve
};

class TieredChunkStore final : public ChunkStore {
 public:
  // Throws kInvalidArgument for no tiers, a tier without a store or
  // promote_after_hits < 1.
  explicit TieredChunkStore(std::vector<ChunkTier> tiers, TieredChunkStoreOptions options = {});
  ~TieredChunkStore() override;

  std::unique_ptr<ChunkLayerSource> find(const ChunkKey& key, const KvShape& shape) override;
  void put(const ChunkKey& key, ChunkKV kv) override;
  // put_placed(wait = true); kIo when no tier took the chunk.
  void put_now(const ChunkKey& key, ChunkKV kv) override;
  // put(), saying where the chunk went: the tier that took it, or nullopt
  // when every tier failed or refused it.  Without `wait`, puts that a
  // store queues and later fails are counted by that store; with it, every
  // tier stores the chunk before returning (put_now) or fails, so a server
  // that refuses the write sends the chunk to the next tier that takes it.
  std::optional<size_t> put_placed(const ChunkKey& key, ChunkKV kv, bool wait = false);
  // From every tier.  false: no tier had it.
  bool remove(const ChunkKey& key) override;

  // Forgets what the budgets hold and the promotion counts: for after the
  // tiers' own stores were cleared.
  void forget_all();

  // The tier (index) a new chunk of this shape (of this model) is placed in.
  size_t placement(const KvShape& shape, const std::string& model_fingerprint = {}) const;
  size_t n_tiers() const;
  ChunkStore& tier_store(size_t tier);
  TieredStats stats() const;

  // Defined in the .cpp; the sources a find hands out share it, so they
  // stay valid (and may still promote) after the store is gone.
  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the promoting sources
};

}  // namespace cb::cache
