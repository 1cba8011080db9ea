// The two cost models the loading controller balances:
// the time to compute one transformer layer for a set of rows, and the time
// to load (read + decode) a layer of stored chunk KV.  Both are fitted from
// measurements on the device, never assumed; calibration.h persists them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"
#include "cache/storage_tier.h"

namespace cb {

class Session;
namespace cache {
class FlashStore;
class ChunkHandle;
}  // namespace cache

// One layer computing `rows` rows whose queries see `keys_per_row` keys on
// average (causal attention: a row at position p sees p + 1 keys):
//   T = per_row_s * rows + per_row_key_s * rows * keys_per_row + per_layer_s
// The first term is the projections and the FFN, the second attention, the
// third per-op dispatch.  Seconds.
struct ComputeCost {
  double per_row_s = 0.0;
  double per_row_key_s = 0.0;
  double per_layer_s = 0.0;

  double layer_seconds(double rows, double keys_per_row) const {
    return per_row_s * rows + per_row_key_s * rows * keys_per_row + per_layer_s;
  }
  // A model that predicts nothing (all zero) is not a measurement.
  bool valid() const { return per_row_s > 0.0 || per_row_key_s > 0.0; }
  bool operator==(const ComputeCost&) const = default;
};

// One observed layer (or a mean over layers of the same shape).
struct LayerTiming {
  double rows = 0.0;
  double keys_per_row = 0.0;
  double seconds = 0.0;
};

// Least squares over the three terms with every coefficient >= 0 (a
// negative per-layer overhead or attention cost would make the controller
// extrapolate nonsense).  Throws cb::Error(kInvalidArgument) for no samples.
ComputeCost fit_compute_cost(std::span<const LayerTiming> samples);

// Sizes of the compute probe: one timed prefill of m rows after a context of
// p tokens for every (m, p); p tokens are prefilled once, untimed, and one
// untimed prefill of the fewest rows comes first (it maps in the weights).
//
// A device whose time barely grows with the rows at these sizes (a GPU,
// where a small prefill costs its kernel launches, not its rows) would fit
// no per-row cost, and a controller without one keeps its floor ratio for
// good.  So while the most rows take less than kRowsVisible times the
// fewest rows' time (at the smallest context), the probe runs again at 4x
// the rows, at most `max_growth` times and while the session's context
// holds them (a context that no longer fits shrinks to what does).  The fit
// uses the last round's samples, the nearest to a request's size.  If no
// round shows the rows, the probe keeps the upper bound the timings allow:
// all of the time per row (per_row_s the least seconds per row of the last
// round, the other terms 0), which overstates the compute of large
// requests (so the controller never skips loads for compute it has not
// seen) until requests' timings scale it (refresh_compute).
struct ComputeProbe {
  static constexpr double kRowsVisible = 1.5;
  std::vector<int64_t> rows = {16, 96};
  std::vector<int64_t> contexts = {0, 512};
  int repeats = 1;  // the fastest of `repeats` runs is kept (noise is one-sided)
  int max_growth = 3;
  // The clock the probe reads, in seconds; steady_clock when empty (tests
  // give it one that a simulated device advances).
  std::function<double()> clock;
};

// Times real prefills of the session's model on its backend and fits the
// per-layer cost (a prefill's time over the layer count; the single
// logits row it also computes lands in per_layer_s).  The session must be
// empty and is left empty; its n_ctx must hold the largest m + p.  The
// samples of every round are returned too when asked for.
ComputeCost probe_compute_cost(Session& s, const ComputeProbe& probe = {},
                               std::vector<LayerTiming>* samples = nullptr);

// Seconds to load `bytes` stored bytes from `tier` with a codec decoding at
// `decode_s_per_byte` (per stored byte).
double load_seconds(double bytes, const cache::StorageTier& tier, double decode_s_per_byte);

// What a short read of a stored chunk measured: the store's read throughput
// (throttle included) and the decode cost of the chunk's codec, both from
// the store's own counters, so they are exactly the quantities T_load uses.
struct StoreProbe {
  cache::Codec codec = cache::Codec::kF16;
  uint64_t bytes = 0;  // stored bytes read
  double read_bytes_per_s = 0.0;
  double decode_s_per_byte = 0.0;
};

// Reads every layer of `handle` through store.fetch_layer.  Throws
// cb::Error(kIo) if a layer cannot be read (the store dropped the entry).
// The counters are per store object: a concurrent reader of the same store
// blurs the measurement, so probe when the store is otherwise idle.
StoreProbe probe_store_load(cache::FlashStore& store, const cache::ChunkHandle& handle);

}  // namespace cb
