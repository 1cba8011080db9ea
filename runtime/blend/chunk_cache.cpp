#include "runtime/blend/chunk_cache.h"

#include <algorithm>
#include <string>
#include <utility>

#include "platform/error.h"

namespace cb {
namespace {

// Calibration saves waiting beside the one running: a request whose save
// finds the queue full leaves it to the next request's.
constexpr size_t kPendingSaves = 2;

}  // namespace

ChunkCache::ChunkCache() = default;

ChunkCache::ChunkCache(const std::string& dir, const cache::StoreOptions& opts,
                       double assumed_read_bytes_per_sec)
    : flash_(std::make_unique<FlashChunkStore>(
          std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir, opts)))),
      assumed_read_bytes_per_sec_(assumed_read_bytes_per_sec) {}

ChunkCache::~ChunkCache() {
  saves_.reset();  // runs the saves still queued
  try {
    if (flash_) flash_->store().flush();
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

void ChunkCache::clear() {
  if (flash_) {
    flash_->store().clear();
  } else {
    table_.clear();
  }
}

void ChunkCache::flush() {
  if (saves_) saves_->flush();
  if (flash_) flash_->store().flush();
}

LoadingController& ChunkCache::controller_for(Session& s, const std::string& device) {
  if (!calibration_db_)
    calibration_db_ = CalibrationDb::open(flash_->store().dir() + "/calibration.sqlite");
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
  if (auto_ratio && !flash_)
    fail(ErrorCode::kInvalidArgument, "auto ratio needs a chunk cache on flash");
  std::unique_lock<std::mutex> auto_lock;
  std::string device;
  try {
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
