// The loading controller: per request, picks the recompute
// ratio r so that recomputing hides the time to load the cached KV, from
// the bytes the request reads and the device's calibrated costs:
//
//   r = clamp(max(r_min, r*), 0, 1)   where   T_recompute(r*) = (1 - m) T_load
//
// with a small margin m (LoadingControllerOptions::hide_margin).  When the
// loads would take longer than recomputing every token, T_load >
// T_recompute(1), the request skips the cache and is a full prefill.
//
// T_load = sum over layers and stored parts of bytes / read_throughput(tier)
// + bytes * decode_cost(codec); T_recompute(r) = sum over layers of the
// per-layer compute model at the rows layer l computes for ratio r (every
// token before the first check layer, then the uncached tokens plus r of
// the reused ones).  Both sides are summed over the whole request, not
// matched layer by layer, because the pipeline's loader may run ahead
// without bound (layer_pipeline.h): load time saved during the expensive
// early layers is spent later.  With r >= r* the loads are hidden and the
// fusion takes about the compute time; below r_min quality would suffer, so
// r never goes there even when storage is fast.  A request whose loads end
// before its recompute starts (the lookahead policy) hides nothing: it
// takes r_min, and skips the cache when T_load + T_recompute(r_min) >
// T_recompute(1).
//
// It also answers the inverse question, for placing new chunks: for a fixed
// r, the cheapest storage tier whose loads stay hidden.
//
// Thread-safe: one controller may serve concurrent requests; refreshes from
// their timings are serialized.
#pragma once

#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/flash_store.h"
#include "runtime/blend/blend_options.h"
#include "runtime/blend/calibration.h"
#include "runtime/blend/fusor.h"

namespace cb {

struct LoadingControllerOptions {
  double r_min = 0.15;  // the smallest ratio with negligible quality loss
  // Weight of a new observation in the moving averages.  High, because a
  // device's compute speed moves quickly (other apps, thermal throttling)
  // and a stale model overshoots r.
  double refresh_alpha = 0.5;
  // r* is chosen so that recompute takes (1 - hide_margin) of the load time,
  // not all of it: the prediction errs on a busy device (by up to ~40 % on
  // the shared 2-core machine of docs/BENCHMARKS.md §8), and the pipeline
  // has a tail (the last layer computes after its load arrives).  Too high
  // an r costs TTFT one for one; too low only leaves some fidelity
  // unbought.  In [0, 1).
  double hide_margin = 0.2;
};

// Bytes a request reads per layer from one place.
struct LayerLoadPart {
  std::string tier;  // a tier of the calibration; unknown or "": reads cost nothing
  std::optional<cache::Codec> codec;  // none: plain floats, nothing to decode
  double bytes_per_layer = 0.0;       // stored bytes, summed over the part's chunks
};

// What the controller needs to know about a request.
struct RequestShape {
  int64_t n_tokens = 0;  // request length
  int64_t n_reused = 0;  // tokens with cached KV that may be reused
  int64_t n_layers = 0;
  int64_t first_check_layer = 1;  // layers before it compute every token
  std::vector<LayerLoadPart> loads;
  // false: the loads are over before the recompute starts (the lookahead
  // policy reads every layer in its reuse pass), so a larger ratio hides
  // nothing and only adds time; the ratio is then the floor.
  bool loads_overlap_recompute = true;
};

struct RatioChoice {
  double ratio = 0.0;  // to use: clamp(max(r_min, r_star), 0, 1)
  // Where predicted recompute = (1 - hide_margin) x predicted load (unclamped).
  double r_star = 0.0;
  double load_s = 0.0;      // predicted load time, all layers
  double compute_s = 0.0;   // predicted compute time at `ratio`, all layers
  bool calibrated = false;  // false: no compute model yet; ratio = r_min
  // Loading is predicted slower than recomputing every token: the request
  // should not read the cache at all (a full prefill; ratio = 1).
  bool skip_loads = false;
};

struct TierChoice {
  cache::StorageTier tier;
  double load_s = 0.0;     // predicted load from this tier, all layers
  double compute_s = 0.0;  // predicted compute at the given ratio
  bool hidden = false;     // (1 - hide_margin) x load_s <= compute_s
};

// The inverse rule itself, pure: of `options` (a tier each, with its
// predicted load and the compute at the chosen ratio), the index of the
// cheapest (lowest cost_rank; ties: faster) whose load is hidden; when none
// is, the fastest.  nullopt when empty.  cheapest_hidden_tier applies it to
// the calibrated tiers, the tiered chunk store to its own.
std::optional<size_t> pick_cheapest_hidden(std::span<const TierChoice> options);

// The schedule with its last check layer's ratio set to r; an earlier check
// layer keeps its own ratio when larger (gradual filtering only narrows).
// An empty schedule becomes [(1, r)].
std::vector<CheckLayer> schedule_with_ratio(std::span<const CheckLayer> schedule, double r);

class LoadingController {
 public:
  explicit LoadingController(Calibration cal = {}, LoadingControllerOptions opts = {});

  Calibration calibration() const;
  void set_calibration(Calibration cal);
  const LoadingControllerOptions& options() const { return opts_; }

  // Predictions, seconds over all layers.  Throws kInvalidArgument for a
  // shape with negative sizes or n_reused > n_tokens.
  double predict_load_s(const RequestShape& shape) const;
  double predict_compute_s(const RequestShape& shape, double ratio) const;

  // r_min: this request's floor instead of the options' (kInvalidArgument
  // outside [0, 1]).
  RatioChoice choose_ratio(const RequestShape& shape, std::optional<double> r_min = {}) const;

  // For a fixed ratio: of the calibrated tiers, the cheapest (lowest
  // cost_rank; ties: faster) from which the request's loads (shape.loads,
  // tiers ignored, codecs and bytes used) stay hidden behind the recompute;
  // if none can hide them, the fastest tier with hidden = false.  nullopt
  // without tiers or without a compute model.
  std::optional<TierChoice> cheapest_hidden_tier(const RequestShape& shape, double ratio) const;

  // Refreshes the compute model from a finished fusion of `shape` (its
  // per-layer timings; check layers, where the row count changes inside the
  // layer, are skipped).
  void observe_fusion(const RequestShape& shape, const FusionStats& st);
  // Refreshes the tier's read throughput and the codec's decode cost from
  // the store's counters around a request (read_counters() before and after).  The
  // decode cost is refreshed only when one codec was decoded (the counters
  // do not split stored bytes by codec).
  void observe_store(const std::string& tier, const cache::ReadCounters& before,
                     const cache::ReadCounters& after);

 private:
  double load_s_locked(const RequestShape& shape, const std::string* tier_override) const;
  double compute_s_locked(const RequestShape& shape, double ratio) const;

  LoadingControllerOptions opts_;
  mutable std::mutex mu_;
  Calibration cal_;
};

// First-use calibration of the compute model: what `db` holds for
// (device, the session's model), with the compute probe run on `scratch`
// (empty, left empty) and saved when there is no compute entry yet, or
// only an unpinned one that predicts nothing.
Calibration load_or_probe_compute(CalibrationDb& db, const std::string& device, Session& scratch,
                                  const ComputeProbe& probe = {});

// Measures a store as tier `name` by reading one stored chunk (probe_store_load)
// and sets the tier's read throughput and the chunk codec's decode cost in
// `cal`, unless pinned.
StoreProbe calibrate_tier(Calibration& cal, const std::string& name, int cost_rank,
                          cache::FlashStore& store, const cache::ChunkHandle& handle);

}  // namespace cb
