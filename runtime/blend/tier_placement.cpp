#include "runtime/blend/tier_placement.h"

#include <algorithm>
#include <vector>

#include "platform/error.h"

namespace cb {
namespace {

// Stored bytes per layer of a chunk in `codec` (none: f32), before zstd: the
// codec's payload plus its scales.  Placement only needs the magnitude.
double stored_bytes_per_layer(std::optional<cache::Codec> codec, const cache::KvShape& s) {
  const double values = 2.0 * static_cast<double>(s.n_tokens) * static_cast<double>(s.kv_dim());
  if (!codec) return 4.0 * values;
  const double head_dim = std::max(1, s.head_dim);
  switch (*codec) {
    case cache::Codec::kF16:
      return 2.0 * values;
    case cache::Codec::kQ8:  // an f16 scale per (token, head)
      return values * (1.0 + 2.0 / head_dim);
    case cache::Codec::kQ4:  // f16 scale and offset per group of 32 (K) or a head (V)
      return values * (0.5 + 2.0 / 32.0 + 2.0 / head_dim);
  }
  return 4.0 * values;
}

// The calibration with every tier it does not know, at its configured costs.
Calibration with_tiers(Calibration cal, std::span<const cache::ChunkTier> tiers) {
  for (const cache::ChunkTier& t : tiers)
    if (!cal.find_tier(t.cost.name)) cal.set_tier({t.cost, 0, true});
  return cal;
}

}  // namespace

TierPlacement::TierPlacement(TierPlacementOptions options) : options_(std::move(options)) {
  if (!(options_.ratio >= 0.0 && options_.ratio <= 1.0))
    fail(ErrorCode::kInvalidArgument, "tier placement: ratio must be in [0, 1]");
  LoadingController check(options_.calibration, options_.controller);  // its options' errors
}

void TierPlacement::set_calibration(const std::string& model_fingerprint, Calibration cal) {
  std::lock_guard lock(mu_);
  model_calibrations_[model_fingerprint] = std::move(cal);
}

bool TierPlacement::has_calibration(const std::string& model_fingerprint) const {
  std::lock_guard lock(mu_);
  return model_calibrations_.count(model_fingerprint) > 0;
}

size_t TierPlacement::tier_for(const cache::KvShape& shape, const std::string& model_fingerprint,
                               std::span<const cache::ChunkTier> tiers) const {
  Calibration cal;
  {
    std::lock_guard lock(mu_);
    auto it = model_calibrations_.find(model_fingerprint);
    cal = it != model_calibrations_.end() ? it->second : options_.calibration;
  }
  const LoadingController controller(with_tiers(std::move(cal), tiers), options_.controller);
  RequestShape request;
  request.n_tokens = shape.n_tokens;
  request.n_reused = shape.n_tokens;
  request.n_layers = shape.n_layers;
  request.first_check_layer = options_.first_check_layer;
  // The chunk's share of a request's compute: the per-layer fixed cost is
  // paid once per request, not per chunk, so it hides no chunk's loads.
  RequestShape none = request;
  none.n_tokens = none.n_reused = 0;
  const double compute = std::max(0.0, controller.predict_compute_s(request, options_.ratio) -
                                           controller.predict_compute_s(none, options_.ratio));
  std::vector<TierChoice> choices;
  for (const cache::ChunkTier& t : tiers) {
    request.loads = {{t.cost.name, t.codec, stored_bytes_per_layer(t.codec, shape)}};
    const double load = controller.predict_load_s(request);
    choices.push_back(
        {t.cost, load, compute, (1.0 - controller.options().hide_margin) * load <= compute});
  }
  return *pick_cheapest_hidden(choices);
}

}  // namespace cb
