// Placement of new chunks in a tiered chunk store (cache/tiered_chunk_store.h)
// by the loading controller's inverse rule (pick_cheapest_hidden): for the
// configured ratio r, the cheapest tier whose predicted load of the chunk
// still hides behind the partial prefill's recompute (the chunk's marginal
// share of it: a request's fixed per-layer cost hides nothing); the fastest
// when none does.  Loads are assumed to overlap the recompute, as with the
// HKVD-style policies; with lookahead they overlap only its reuse pass, so
// a tier judged hidden may not be.  The compute model is the chunk's
// model's (set_calibration), else the options'; tiers a calibration does
// not know are predicted from their configured costs.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cache/tiered_chunk_store.h"
#include "runtime/blend/calibration.h"
#include "runtime/blend/loading_controller.h"

namespace cb {

struct TierPlacementOptions {
  double ratio = 0.15;  // the recompute ratio new chunks are placed for
  // The compute model and decode costs placement predicts with.  Without a
  // compute model nothing hides a load, and chunks go to the fastest tier.
  Calibration calibration;
  LoadingControllerOptions controller;
  int first_check_layer = 1;  // as the blend's schedule: layers before it compute every token
};

class TierPlacement final : public cache::ChunkPlacement {
 public:
  // Throws kInvalidArgument for a ratio outside [0, 1].
  explicit TierPlacement(TierPlacementOptions options = {});

  size_t tier_for(const cache::KvShape& shape, const std::string& model_fingerprint,
                  std::span<const cache::ChunkTier> tiers) const override;

  // The calibration chunks of this model are placed with (its compute
  // model, decode costs and measured tiers), instead of the options'.
  // Thread-safe.
  void set_calibration(const std::string& model_fingerprint, Calibration cal);
  bool has_calibration(const std::string& model_fingerprint) const;

 private:
  TierPlacementOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Calibration> model_calibrations_;
};

}  // namespace cb
