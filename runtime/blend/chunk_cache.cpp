#include "runtime/blend/chunk_cache.h"

#include <algorithm>
#include <string>
#include <utility>

#include "platform/error.h"
#if CB_WITH_REDIS
#include "cache/redis_chunk_store.h"
#endif

namespace cb {
namespace {

// Calibration saves waiting beside the one running: a request whose save
// finds the queue full leaves it to the next request's.
constexpr size_t kPendingSaves = 2;

}  // namespace

ChunkCache::ChunkCache() = default;

ChunkCache::ChunkCache(const std::string& dir, const cache::StoreOptions& opts,
                       double assumed_read_bytes_per_sec, const ChunkCacheTiers& tiers)
    : flash_(std::make_shared<cache::FlashChunkStore>(
          std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir, opts)))),
      assumed_read_bytes_per_sec_(assumed_read_bytes_per_sec),
      open_report_(flash_->store().open_report()) {
  if (!tiers.any()) return;
  if (!(tiers.placement_ratio >= 0.0 && tiers.placement_ratio <= 1.0))
    fail(ErrorCode::kInvalidArgument, "placement ratio must be in [0, 1]");
  // Read speeds placement predicts with until the calibration knows a
  // tier: RAM free, flash at its assumed speed or a typical one, the slow
  // directory at its cap, the server at about 1 GbE.
  const auto tier = [](const char* name, double read, int rank,
                       std::shared_ptr<cache::ChunkStore> store, std::optional<cache::Codec> codec,
                       uint64_t capacity, bool shared = false) {
    cache::ChunkTier t;
    t.shared = shared;
    t.cost.name = name;
    t.cost.read_bytes_per_s = read;
    t.cost.cost_rank = rank;
    t.store = std::move(store);
    t.codec = codec;
    t.capacity_bytes = capacity;
    return t;
  };
  std::vector<cache::ChunkTier> list;
  if (tiers.ram_budget_bytes > 0) {
    ram_tier_ = std::make_shared<cache::RamChunkStore>();
    list.push_back(tier("ram", 0.0, 3, ram_tier_, std::nullopt, tiers.ram_budget_bytes));
  }
  const double flash_read = assumed_read_bytes_per_sec > 0.0 ? assumed_read_bytes_per_sec
                            : opts.read_bytes_per_sec > 0
                                ? static_cast<double>(opts.read_bytes_per_sec)
                                : 1e9;
  list.push_back(tier("flash", flash_read, 2, flash_, opts.codec, 0));
  if (!tiers.slow_dir.empty()) {
    cache::StoreOptions slow_opts = opts;
    slow_opts.read_bytes_per_sec = tiers.slow_read_bytes_per_sec;
    // Flash may hold every chunk: an SD card remounted read-only after
    // errors, or gone, must not stop the answers.  A read-only one is
    // skipped too: placement would keep sending new chunks there, to be
    // lost.
    std::string unavailable;
    try {
      slow_ =
          std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(tiers.slow_dir, slow_opts));
      if (slow_->stats().read_only) {
        unavailable = "it cannot be written";
        slow_.reset();
      } else {
        open_report_ += slow_->open_report();
      }
    } catch (const Error& e) {
      unavailable = e.what();
    }
    if (!unavailable.empty()) {
      ++unavailable_tiers_;
      open_report_ += "the slow tier " + tiers.slow_dir + " is unavailable (" + unavailable +
                      "): skipped; chunks are read from the other tiers or computed\n";
    }
  }
  if (slow_) {
    const double read = tiers.slow_read_bytes_per_sec > 0
                            ? static_cast<double>(tiers.slow_read_bytes_per_sec)
                            : flash_read / 10.0;
    list.push_back(
        tier("slow", read, 1, std::make_shared<cache::FlashChunkStore>(slow_), opts.codec, 0));
  }
  if (tiers.redis) {
#if CB_WITH_REDIS
    redis_ = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(*tiers.redis));
    list.push_back(tier("redis", 1.25e8, 0, std::make_shared<cache::RedisChunkStore>(redis_),
                        tiers.redis->codec, 0, true));
#else
    fail(ErrorCode::kUnsupported,
         "this build of cacheblend has no Redis tier (configured with CB_REDIS=OFF, or "
         "hiredis was not found); leave the Redis address unset");
#endif
  }
  TierPlacementOptions popts;
  popts.ratio = tiers.placement_ratio;
  placement_ = std::make_shared<TierPlacement>(popts);
  cache::TieredChunkStoreOptions topts;
  topts.placement = placement_;
  tiered_ = std::make_unique<cache::TieredChunkStore>(std::move(list), topts);
}

ChunkCache::~ChunkCache() {
  saves_.reset();  // runs the saves still queued
  try {
    flush();
  } catch (...) {
  }
}

cache::StoreStats ChunkCache::stats() const {
  if (flash_) return flash_->store().stats();
  cache::StoreStats st;
  st.entries = table_.size();
  st.bytes = table_.bytes();
  return st;
}

cache::TieredStats ChunkCache::tier_stats() const {
  if (tiered_) return tiered_->stats();
  cache::TieredStats out;
  if (flash_) {
    const cache::StoreStats st = flash_->store().stats();
    cache::TierStats t;
    t.name = "flash";
    t.hits = st.hits;
    t.misses = st.misses;
    t.bytes_read = st.bytes_read;
    out.tiers.push_back(t);
    out.misses = st.misses;
  }
  return out;
}

void ChunkCache::prepare_placement(Session& s, int n_threads) {
  if (!placement_ || placement_->has_calibration(s.model().fingerprint())) return;
  std::lock_guard lock(auto_mu_);
  if (placement_->has_calibration(s.model().fingerprint())) return;
  LoadingController& ctrl = controller_for(s, default_device_id(s.backend().name(), n_threads));
  placement_->set_calibration(s.model().fingerprint(), ctrl.calibration());
}

void ChunkCache::add(const cache::ChunkKey& key, cache::ChunkKV kv) {
  if (tiered_) {
    const std::optional<size_t> tier = tiered_->put_placed(key, std::move(kv), /*wait=*/true);
    flush();  // demotions it made room with are queued
    if (!tier) {
      std::string why;
      for (const cache::TierStats& t : tiered_->stats().tiers)
        if (!t.last_error.empty()) why += " " + t.name + ": " + t.last_error + ";";
      fail(ErrorCode::kIo, "no storage tier took the chunk's KV" +
                               (why.empty() ? std::string() : " (" + why.substr(1) + ")"));
    }
    return;
  }
  if (!flash_) {
    table_.put(key, std::move(kv));
    return;
  }
  cache::PutResult put;
  try {
    put = flash_->store().put(key, kv.view());
  } catch (const Error& err) {
    // The store refuses values its codec cannot hold (inf, NaN, beyond f16):
    // not the caller's argument, so not kInvalidArgument.
    if (err.code() != ErrorCode::kInvalidArgument) throw;
    fail(ErrorCode::kUnsupported,
         std::string("the chunk's KV cannot be stored on flash: ") + err.what());
  }
  if (put == cache::PutResult::kNoRoom)
    fail(ErrorCode::kIo,
         "the chunk does not fit in the cache on flash (larger than its capacity_bytes, or every "
         "other entry is pinned)");
}

void ChunkCache::clear() {
  if (flash_) {
    flash_->store().clear();
  } else {
    table_.clear();
  }
  if (ram_tier_) ram_tier_->clear();
  if (slow_) {
    slow_->flush();
    slow_->clear();
  }
  // The shared server is left alone: its values are every device's, and
  // leave by its eviction policy or TTL (remove() drops a single chunk).
  flush_redis();
  if (tiered_) tiered_->forget_all();
}

void ChunkCache::flush() {
  if (saves_) saves_->flush();
  if (flash_) flash_->store().flush();
  if (slow_) slow_->flush();
  flush_redis();
}

void ChunkCache::flush_redis() {
#if CB_WITH_REDIS
  if (redis_) redis_->flush();
#endif
}

LoadingController& ChunkCache::controller_for(Session& s, const std::string& device) {
  if (!calibration_db_) {
    try {
      calibration_db_ = CalibrationDb::open(flash_->store().dir() + "/calibration.sqlite");
    } catch (const Error& e) {
      // A store that cannot be written (a full disk, a read-only file
      // system) still answers: the costs are measured again and kept for
      // this process only.
      if (e.code() != ErrorCode::kIo) throw;
      calibration_db_ = CalibrationDb::open(":memory:");
    }
  }
  auto& ctrl = controllers_[device + "/" + s.model().fingerprint()];
  if (!ctrl) {
    // The compute probe runs in this (still empty) session: sized to its
    // context (rows x prefix lengths must fit).
    ComputeProbe probe;
    const int64_t room = s.n_ctx();
    probe.rows = {std::max<int64_t>(1, std::min<int64_t>(16, room / 8)),
                  std::max<int64_t>(2, std::min<int64_t>(96, room / 4))};
    probe.contexts = {0, std::max<int64_t>(1, std::min<int64_t>(512, room - probe.rows[1]))};
    Calibration cal = load_or_probe_compute(*calibration_db_, device, s, probe);
    // The caller's read speed is pinned (refreshes leave it); without one, a
    // speed pinned by an earlier caller is measured again.
    if (assumed_read_bytes_per_sec_ > 0.0) {
      cal.set_tier({{"flash", assumed_read_bytes_per_sec_, 0}, 0, true});
    } else if (const CalibratedTier* t = cal.find_tier("flash"); t && t->pinned) {
      CalibratedTier measured = *t;
      measured.pinned = false;
      cal.set_tier(measured);
    }
    ctrl = std::make_unique<LoadingController>(std::move(cal));
  }
  return *ctrl;
}

std::span<const float> ChunkCache::prefill(Session& s, const RagPrompt& prompt,
                                           RagPrefillOptions opts, bool auto_ratio, int n_threads,
                                           RagPrefillStats* stats) {
  // Before the controller's first-use probe, not only in rag_prefill.
  check_rag_request_fits(s, prompt, opts.chunk_head);
  opts.blend.context_scale = context_scale_;
  opts.neighbour_kv = neighbour_kv_;
  if (auto_ratio && !flash_)
    fail(ErrorCode::kInvalidArgument, "auto ratio needs a chunk cache on flash");
  std::unique_lock<std::mutex> auto_lock;
  std::string device;
  try {
    // Before anything uses the (still empty) session; FULL stores nothing.
    if (opts.blend.mode != BlendMode::kFull) prepare_placement(s, n_threads);
    if (auto_ratio) {
      auto_lock = std::unique_lock<std::mutex>(auto_mu_);
      device = default_device_id(s.backend().name(), n_threads);
      opts.controller = &controller_for(s, device);
      opts.storage_tier = "flash";
    }
    auto logits = rag_prefill(s, prompt, &kv(), opts, stats);
    if (opts.controller) {
      // What the request taught the controller, saved by the worker.
      if (!saves_) saves_ = std::make_unique<cache::WriteBackQueue>(kPendingSaves);
      saves_->push([db = calibration_db_.get(), device, fingerprint = s.model().fingerprint(),
                    cal = opts.controller->calibration()] {
        try {
          db->save(device, fingerprint, cal);
        } catch (...) {
          // Lost for now: the next request saves the calibration again.
        }
      });
    }
    return logits;
  } catch (...) {
    s.truncate(0);
    throw;
  }
}

}  // namespace cb
