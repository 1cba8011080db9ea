// A device's calibrated costs for one model: what the loading controller
// needs to choose a recompute ratio, measured by probes, refreshed from real
// request timings, overridable by the caller, and persisted in SQLite so a
// device measures once, not at every start.
//
// Database (a file the caller names, e.g. <store dir>/calibration.sqlite):
//   compute_cost(device, model, per_row_s, per_row_key_s, per_layer_s, ...)
//   decode_cost(device, model, codec, s_per_byte, ...)
//   storage_tier(device, name, read_bytes_per_s, cost_rank, ...)
// Storage tiers are keyed by device only: read throughput does not depend on
// the model.  Every row carries `pinned` (set by an explicit override; a
// refresh never moves a pinned value) and the number of observations.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"
#include "runtime/blend/cost_model.h"

struct sqlite3;

namespace cb {

struct CalibratedCompute {
  ComputeCost cost;
  int64_t observations = 0;  // request refreshes since the last probe or override
  bool pinned = false;       // set by the caller: refreshes leave it alone
  bool operator==(const CalibratedCompute&) const = default;
};

struct CalibratedDecode {
  cache::Codec codec = cache::Codec::kF16;
  double s_per_byte = 0.0;  // per stored byte
  int64_t observations = 0;
  bool pinned = false;
  bool operator==(const CalibratedDecode&) const = default;
};

struct CalibratedTier {
  cache::StorageTier tier;
  int64_t observations = 0;
  bool pinned = false;
  bool operator==(const CalibratedTier&) const = default;
};

struct Calibration {
  std::optional<CalibratedCompute> compute;
  std::vector<CalibratedDecode> decode;  // one per codec
  std::vector<CalibratedTier> tiers;     // one per name

  // Lookups; null when not calibrated.
  const CalibratedDecode* find_decode(cache::Codec codec) const;
  const CalibratedTier* find_tier(const std::string& name) const;
  // Inserts or replaces (keeps the slot's position).
  void set_decode(const CalibratedDecode& d);
  void set_tier(const CalibratedTier& t);
  bool operator==(const Calibration&) const = default;
};

// Refreshes from real timings with an exponential moving average: the new
// value is (1 - alpha) * old + alpha * observed.  Pinned entries are left
// alone; alpha is in (0, 1].  A storage tier or codec seen for the first time
// is created from the observation (the first request is its probe); a
// compute model must come from the probe (one request cannot fit it).
//
// Compute: one request's layers cannot determine three coefficients, so the
// observation moves their common scale: the ratio of observed to predicted
// time over the given layers is averaged into every coefficient.  That
// tracks what changes on a device (clock scaling, other load) while keeping
// the probe's split between the terms.
void refresh_compute(Calibration& cal, std::span<const LayerTiming> layers, double alpha);
void refresh_decode(Calibration& cal, cache::Codec codec, double bytes, double seconds,
                    double alpha);
void refresh_read(Calibration& cal, const std::string& tier, double bytes, double seconds,
                  double alpha);

// The persisted calibrations of every (device, model).  Thread-safe (one
// connection behind a mutex; SQLite's busy timeout orders other processes).
class CalibrationDb {
 public:
  // Opens or creates the database.  A damaged one is moved to
  // `path + ".corrupt"` and replaced by an empty one (the costs are measured
  // again).  Throws cb::Error(kIo) naming the path.
  static std::unique_ptr<CalibrationDb> open(const std::string& path);
  ~CalibrationDb();
  CalibrationDb(const CalibrationDb&) = delete;
  CalibrationDb& operator=(const CalibrationDb&) = delete;

  // What is stored for the device and model (storage tiers: for the device);
  // empty when nothing is.
  Calibration load(const std::string& device, const std::string& model) const;
  // Replaces the stored entries of (device, model) with cal's; entries absent
  // from cal are kept.  One transaction.
  void save(const std::string& device, const std::string& model, const Calibration& cal);
  const std::string& path() const { return path_; }

 private:
  CalibrationDb(std::string path, sqlite3* db);
  // Throws kFormat when the file is not a sound SQLite database.
  static std::unique_ptr<CalibrationDb> open_once(const std::string& path);
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

// A name for this machine's compute setup, the calibration's device key: the
// backend, the CPU model (Linux), hardware threads and the session's
// threads -- what changes the per-layer cost.
std::string default_device_id(const char* backend_name, int n_threads);

}  // namespace cb
