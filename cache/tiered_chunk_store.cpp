#include "cache/tiered_chunk_store.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "cache/eviction.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

// Full reads from slower tiers remembered per chunk for promote_after_hits;
// beyond this many chunks the counts start over (a bound, not a policy).
constexpr size_t kMaxTrackedSlowHits = 65536;

uint64_t decoded_bytes(const ChunkKV& kv) {
  return (kv.k.size() + kv.v.size()) * sizeof(float);
}

enum class Arrival { kPlaced, kPromoted, kDemoted };

}  // namespace

struct TieredChunkStore::State {
  struct Budgeted {
    ChunkKey key;
    KvShape shape;  // as put: what a demotion reads back
    uint64_t bytes = 0;
    std::list<std::string>::iterator lru;
    uint64_t hits = 0;  // finds this tier served it since it came
  };
  struct Tier {
    ChunkTier config;
    TierStats stats;
    std::list<std::string> lru;  // serialized keys, least recently used first
    std::unordered_map<std::string, Budgeted> entries;
  };

  State(std::vector<ChunkTier> configs, TieredChunkStoreOptions opts) : options(std::move(opts)) {
    for (ChunkTier& c : configs) {
      Tier t;
      t.stats.name = c.cost.name;
      t.config = std::move(c);
      tiers.push_back(std::move(t));
    }
  }

  // Everything below runs with mu held.

  void note_failure(size_t i, const std::string& what) {
    tiers[i].stats.failures++;
    tiers[i].stats.last_error = what;
  }

  void touch(size_t i, const std::string& id) {
    Tier& t = tiers[i];
    auto it = t.entries.find(id);
    if (it != t.entries.end()) t.lru.splice(t.lru.end(), t.lru, it->second.lru);
  }

  void forget(size_t i, const std::string& id) {
    Tier& t = tiers[i];
    auto it = t.entries.find(id);
    if (it == t.entries.end()) return;
    t.stats.budget_bytes -= it->second.bytes;
    t.lru.erase(it->second.lru);
    t.entries.erase(it);
  }

  // The whole chunk from tier i, or nullopt.
  std::optional<ChunkKV> read_whole(size_t i, const ChunkKey& key, const KvShape& shape) {
    try {
      std::unique_ptr<ChunkLayerSource> src = tiers[i].config.store->find(key, shape);
      if (!src) return std::nullopt;
      ChunkKV kv(shape);
      for (int l = 0; l < kv.shape.n_layers; ++l)
        if (!src->fetch_layer(l, kv.k_layer(l), kv.v_layer(l))) return std::nullopt;
      return kv;
    } catch (const std::exception& e) {
      note_failure(i, e.what());
      return std::nullopt;
    }
  }

  bool holds(size_t i, const ChunkKey& key, const KvShape& shape) {
    try {
      return tiers[i].config.store->find(key, shape) != nullptr;
    } catch (const std::exception& e) {
      note_failure(i, e.what());
      return false;
    }
  }

  // Moves tier i's chunk `id` one tier down (or drops it from the last).
  void demote(size_t i, const std::string& id) {
    const ChunkKey key = tiers[i].entries.at(id).key;
    const KvShape shape = tiers[i].entries.at(id).shape;
    forget(i, id);
    if (i + 1 < tiers.size()) {
      if (holds(i + 1, key, shape)) {
        touch(i + 1, id);
        tiers[i + 1].stats.demoted_in++;
      } else if (std::optional<ChunkKV> kv = read_whole(i, key, shape)) {
        store_in(i + 1, key, id, std::move(*kv), Arrival::kDemoted);
      }
    } else {
      tiers[i].stats.dropped++;
    }
    try {
      tiers[i].config.store->remove(key);
    } catch (const std::exception& e) {
      note_failure(i, e.what());
    }
  }

  // Demotes tier i's least recently used chunks until `incoming` fits.
  void make_room(size_t i, uint64_t incoming) {
    Tier& t = tiers[i];
    std::vector<EvictionCandidate> candidates;
    std::vector<std::string> ids;
    for (const std::string& id : t.lru) {
      candidates.push_back({static_cast<int64_t>(ids.size()), t.entries.at(id).bytes});
      ids.push_back(id);
    }
    const size_t n =
        plan_eviction(t.stats.budget_bytes, incoming, t.config.capacity_bytes, candidates)
            .value_or(ids.size());
    for (size_t v = 0; v < n; ++v) demote(i, ids[v]);
  }

  // Puts the chunk in tier i, or the first tier below it that takes it.
  // `skip_shared`: pass over the shared tiers below i (a put already wrote
  // through to them).
  // Returns the tier that took it.
  // `only_this`: tier i or nothing.
  // `wait`: each tier's put_now (stored before returning, or a failure).
  std::optional<size_t> store_in(size_t i, const ChunkKey& key, const std::string& id, ChunkKV kv,
                                 Arrival arrival, bool skip_shared = false, bool only_this = false,
                                 bool wait = false) {
    const uint64_t bytes = decoded_bytes(kv);
    const KvShape shape = kv.shape;
    const size_t first = i;
    const size_t end = only_this ? i + 1 : tiers.size();
    for (; i < end; ++i) {
      Tier& t = tiers[i];
      if (skip_shared && i > first && t.config.shared) continue;
      const bool budgeted = t.config.capacity_bytes > 0;
      if (budgeted) {
        if (bytes > t.config.capacity_bytes) continue;  // never fits here
        forget(i, id);                                  // a put of a chunk already here replaces it
        make_room(i, bytes);
      }
      const bool last = i + 1 == end;
      try {
        // A copy for every tier but the last: the chunk must survive a put
        // that fails.
        ChunkKV copy = last ? std::move(kv) : ChunkKV(kv);
        if (wait) {
          t.config.store->put_now(key, std::move(copy));
        } else {
          t.config.store->put(key, std::move(copy));
        }
      } catch (const std::exception& e) {
        note_failure(i, e.what());
        continue;
      }
      if (budgeted) {
        t.lru.push_back(id);
        t.entries[id] = {key, shape, bytes, std::prev(t.lru.end())};
        t.stats.budget_bytes += bytes;
      }
      (arrival == Arrival::kPlaced     ? t.stats.placed
       : arrival == Arrival::kPromoted ? t.stats.promoted_in
                                       : t.stats.demoted_in)++;
      return i;
    }
    return std::nullopt;
  }

  // A promoting source read every layer of the chunk from tier `from`.
  // `kv`: the copy the source kept; none when it kept none (only counted).
  void on_full_read(const ChunkKey& key, std::optional<ChunkKV> kv, size_t from) {
    std::lock_guard lock(mu);
    try {
      const std::string id = serialize_key(key);
      if (slow_hits.size() >= kMaxTrackedSlowHits) slow_hits.clear();
      const int count = ++slow_hits[id];
      if (!kv || count < options.promote_after_hits || !admits(from, decoded_bytes(*kv), count))
        return;  // (still counting)
      slow_hits.erase(id);
      if (const std::optional<size_t> to = promotion_target(from))
        store_in(*to, key, id, std::move(*kv), Arrival::kPromoted, false, /*only_this=*/true);
    } catch (const std::exception& e) {
      note_failure(from - 1, std::string("promotion failed: ") + e.what());
    }
  }

  // Whether a chunk read in full from tier `from` for the count-th time is
  // copied up: into a tier with room, or, when that tier's budget is full,
  // only if read more often (by more than one read) than the least recently
  // used chunk there was hit (it would push that one out).  Without that rule a working set larger
  // than the budget, read in a cycle, would copy every chunk up and push it out again before its
  // next read: work for no hit.
  bool admits(size_t from, uint64_t bytes, int count) const {
    const std::optional<size_t> to = promotion_target(from);
    if (!to) return false;
    const Tier& t = tiers[*to];
    if (t.config.capacity_bytes == 0) return true;
    if (bytes > t.config.capacity_bytes) return false;
    if (t.stats.budget_bytes + bytes <= t.config.capacity_bytes || t.lru.empty()) return true;
    // By more than one: a chunk read by the same requests as the victim is
    // one read ahead of it or behind it depending on the order of the
    // request's lookups, and must not count as more often.  A victim never
    // hit since it came gives way to any read.
    const uint64_t victim = t.entries.at(t.lru.front()).hits;
    return static_cast<uint64_t>(count) > (victim == 0 ? 0 : victim + 1);
  }

  // Where a chunk read in full from tier `from` is copied: the nearest tier
  // above that reads at least as fast (read speed 0: RAM, free).  A slower
  // local tier listed above a faster remote one (an SD card over a server)
  // is passed over.
  std::optional<size_t> promotion_target(size_t from) const {
    const double src = tiers[from].config.cost.read_bytes_per_s;
    for (size_t j = from; j-- > 0;) {
      const double r = tiers[j].config.cost.read_bytes_per_s;
      if (r <= 0.0 || (src > 0.0 && r >= src)) return j;
    }
    return std::nullopt;
  }

  // Copies of a new chunk placed in tier `placed` into the shared tiers
  // below it.
  void write_through(size_t placed, const ChunkKey& key, const ChunkKV& kv, bool wait) {
    for (size_t j = placed + 1; j < tiers.size(); ++j) {
      if (!tiers[j].config.shared) continue;
      try {
        if (wait) {
          tiers[j].config.store->put_now(key, ChunkKV(kv));
        } else {
          tiers[j].config.store->put(key, ChunkKV(kv));
        }
        tiers[j].stats.placed++;
      } catch (const std::exception& e) {
        note_failure(j, e.what());
      }
    }
  }

  std::vector<Tier> tiers;
  TieredChunkStoreOptions options;
  mutable std::mutex mu;
  uint64_t misses = 0;
  std::unordered_map<std::string, int> slow_hits;
};

namespace {

// Serves a chunk from tier `from`, counting what it reads there; from a
// slower tier it also keeps a copy of each layer read, and once every layer
// has been read, the copy goes one tier up.
class TierSource final : public ChunkLayerSource {
 public:
  using State = TieredChunkStore::State;
  // From a slower tier, full reads are counted; with `promote`, a copy of
  // what is read is kept for a promotion.
  // `shape`: the one the find asked for (the inner source's, checked by
  // its store), never one a stored value claims.
  TierSource(std::shared_ptr<State> state, std::unique_ptr<ChunkLayerSource> inner, ChunkKey key,
             size_t from, const KvShape& shape, bool promote)
      : state_(std::move(state)),
        inner_(std::move(inner)),
        key_(std::move(key)),
        from_(from),
        shape_(shape) {
    if (from_ > 0) {
      n_layers_ = shape.n_layers;
      got_.assign(static_cast<size_t>(n_layers_), false);
      if (promote) copy_.emplace(shape);
    }
  }

  bool fetch_layer(int64_t layer, float* k, float* v) override {
    bool ok = false;
    try {
      ok = inner_->fetch_layer(layer, k, v);
    } catch (...) {
      note_read_failure();
      throw;  // the fusor computes the chunk, as for false
    }
    if (!ok) {
      note_read_failure();
      return false;
    }
    {
      const uint64_t bytes = inner_->layer_bytes(layer);
      std::lock_guard lock(state_->mu);
      state_->tiers[from_].stats.bytes_read += bytes;
    }
    if (failed_ || layer < 0 || layer >= n_layers_ || got_[layer]) return true;
    if (copy_) {
      const size_t n = static_cast<size_t>(copy_->shape.layer_floats());
      std::memcpy(copy_->k_layer(static_cast<int>(layer)), k, n * sizeof(float));
      std::memcpy(copy_->v_layer(static_cast<int>(layer)), v, n * sizeof(float));
    }
    got_[layer] = true;
    if (++n_got_ == n_layers_) {
      std::optional<ChunkKV> copy = std::move(copy_);
      copy_.reset();
      state_->on_full_read(key_, std::move(copy), from_);
    }
    return true;
  }
  uint64_t layer_bytes(int64_t layer) const override { return inner_->layer_bytes(layer); }
  std::optional<Codec> codec() const override { return inner_->codec(); }
  std::optional<KvShape> shape() const override { return shape_; }

 private:
  void note_read_failure() {
    failed_ = true;
    std::lock_guard lock(state_->mu);
    state_->tiers[from_].stats.read_failures++;
  }

  std::shared_ptr<State> state_;
  std::unique_ptr<ChunkLayerSource> inner_;
  ChunkKey key_;
  size_t from_;
  KvShape shape_;
  std::optional<ChunkKV> copy_;  // from a slower tier: what the fusor read
  std::vector<bool> got_;
  int n_layers_ = 0;  // 0: not counting (the fastest tier)
  int n_got_ = 0;
  bool failed_ = false;
};

}  // namespace

TieredChunkStore::TieredChunkStore(std::vector<ChunkTier> tiers, TieredChunkStoreOptions options) {
  if (tiers.empty()) fail(ErrorCode::kInvalidArgument, "tiered chunk store: no tiers");
  for (const ChunkTier& t : tiers)
    if (!t.store)
      fail(ErrorCode::kInvalidArgument,
           "tiered chunk store: tier '" + t.cost.name + "' has no store");
  if (options.promote_after_hits < 1)
    fail(ErrorCode::kInvalidArgument, "tiered chunk store: promote_after_hits must be >= 1");
  state_ = std::make_shared<State>(std::move(tiers), std::move(options));
}

TieredChunkStore::~TieredChunkStore() = default;

size_t TieredChunkStore::n_tiers() const {
  return state_->tiers.size();
}

ChunkStore& TieredChunkStore::tier_store(size_t tier) {
  return *state_->tiers.at(tier).config.store;
}

size_t TieredChunkStore::placement(const KvShape& shape,
                                   const std::string& model_fingerprint) const {
  const State& s = *state_;
  if (!s.options.placement) return 0;
  std::vector<ChunkTier> configs;
  for (const State::Tier& t : s.tiers) configs.push_back(t.config);
  return std::min(s.options.placement->tier_for(shape, model_fingerprint, configs),
                  configs.size() - 1);
}

std::unique_ptr<ChunkLayerSource> TieredChunkStore::find(const ChunkKey& key,
                                                         const KvShape& shape) {
  State& s = *state_;
  const std::string id = serialize_key(key);
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    std::unique_ptr<ChunkLayerSource> src;
    try {
      src = s.tiers[i].config.store->find(key, shape);
    } catch (const std::exception& e) {
      std::lock_guard lock(s.mu);
      s.note_failure(i, e.what());
      continue;
    }
    std::lock_guard lock(s.mu);
    if (!src) {
      s.tiers[i].stats.misses++;
      s.forget(i, id);  // gone from the store (its own eviction): stop counting it
      continue;
    }
    s.tiers[i].stats.hits++;
    s.touch(i, id);
    if (auto e = s.tiers[i].entries.find(id); e != s.tiers[i].entries.end()) e->second.hits++;
    bool promote = false;
    if (i > 0) {
      auto c = s.slow_hits.find(id);
      const int count = (c == s.slow_hits.end() ? 0 : c->second) + 1;  // this read's
      promote = count >= s.options.promote_after_hits &&
                s.admits(i, 2 * shape.layer_floats() * shape.n_layers * sizeof(float), count);
    }
    return std::make_unique<TierSource>(state_, std::move(src), key, i, shape, promote);
  }
  std::lock_guard lock(s.mu);
  s.misses++;
  return nullptr;
}

void TieredChunkStore::put(const ChunkKey& key, ChunkKV kv) {
  put_placed(key, std::move(kv));
}

void TieredChunkStore::put_now(const ChunkKey& key, ChunkKV kv) {
  if (!put_placed(key, std::move(kv), /*wait=*/true))
    fail(ErrorCode::kIo, "no storage tier took the chunk's KV");
}

std::optional<size_t> TieredChunkStore::put_placed(const ChunkKey& key, ChunkKV kv, bool wait) {
  const size_t tier = placement(kv.shape, key.model_fingerprint);
  State& s = *state_;
  std::lock_guard lock(s.mu);
  const std::string id = serialize_key(key);
  s.write_through(tier, key, kv, wait);
  // Failing that tier and every one below, the nearest faster tier that
  // takes it (the chunk was computed: better kept fast than lost).
  if (tier == 0)
    return s.store_in(0, key, id, std::move(kv), Arrival::kPlaced, /*skip_shared=*/true,
                      /*only_this=*/false, wait);
  if (std::optional<size_t> at = s.store_in(tier, key, id, ChunkKV(kv), Arrival::kPlaced,
                                            /*skip_shared=*/true, /*only_this=*/false, wait))
    return at;
  for (size_t up = tier; up-- > 0;) {
    if (std::optional<size_t> at = s.store_in(up, key, id, ChunkKV(kv), Arrival::kPlaced,
                                              /*skip_shared=*/true, /*only_this=*/true, wait))
      return at;
  }
  return std::nullopt;
}

bool TieredChunkStore::remove(const ChunkKey& key) {
  State& s = *state_;
  const std::string id = serialize_key(key);
  bool any = false;
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    try {
      any = s.tiers[i].config.store->remove(key) || any;
    } catch (const std::exception& e) {
      std::lock_guard lock(s.mu);
      s.note_failure(i, e.what());
    }
    std::lock_guard lock(s.mu);
    s.forget(i, id);
  }
  return any;
}

void TieredChunkStore::forget_all() {
  State& s = *state_;
  std::lock_guard lock(s.mu);
  for (State::Tier& t : s.tiers) {
    t.entries.clear();
    t.lru.clear();
    t.stats.budget_bytes = 0;
  }
  s.slow_hits.clear();
}

TieredStats TieredChunkStore::stats() const {
  const State& s = *state_;
  std::lock_guard lock(s.mu);
  TieredStats out;
  for (const State::Tier& t : s.tiers) out.tiers.push_back(t.stats);
  out.misses = s.misses;
  return out;
}

}  // namespace cb::cache
