#include "runtime/blend/loading_controller.h"

#include <algorithm>
#include <limits>

#include "platform/error.h"
#include "runtime/session.h"

namespace cb {

std::vector<CheckLayer> schedule_with_ratio(std::span<const CheckLayer> schedule, double r) {
  const float rf = static_cast<float>(std::clamp(r, 0.0, 1.0));
  if (schedule.empty()) return {CheckLayer{1, rf}};
  std::vector<CheckLayer> out(schedule.begin(), schedule.end());
  for (CheckLayer& c : out) c.ratio = std::max(c.ratio, rf);
  out.back().ratio = rf;
  return out;
}

std::optional<size_t> pick_cheapest_hidden(std::span<const TierChoice> options) {
  if (options.empty()) return std::nullopt;
  std::optional<size_t> best_hidden;
  size_t fastest = 0;
  for (size_t i = 0; i < options.size(); ++i) {
    const TierChoice& o = options[i];
    if (o.load_s < options[fastest].load_s) fastest = i;
    if (!o.hidden) continue;
    if (!best_hidden) {
      best_hidden = i;
      continue;
    }
    const TierChoice& b = options[*best_hidden];
    if (o.tier.cost_rank < b.tier.cost_rank ||
        (o.tier.cost_rank == b.tier.cost_rank && o.load_s < b.load_s))
      best_hidden = i;
  }
  return best_hidden ? *best_hidden : fastest;
}

LoadingController::LoadingController(Calibration cal, LoadingControllerOptions opts)
    : opts_(opts), cal_(std::move(cal)) {
  if (!(opts_.r_min >= 0.0 && opts_.r_min <= 1.0))
    fail(ErrorCode::kInvalidArgument, "r_min must be in [0, 1]");
  if (!(opts_.refresh_alpha > 0.0 && opts_.refresh_alpha <= 1.0))
    fail(ErrorCode::kInvalidArgument, "refresh_alpha must be in (0, 1]");
  if (!(opts_.hide_margin >= 0.0 && opts_.hide_margin < 1.0))
    fail(ErrorCode::kInvalidArgument, "hide_margin must be in [0, 1)");
}

Calibration LoadingController::calibration() const {
  std::lock_guard lock(mu_);
  return cal_;
}

void LoadingController::set_calibration(Calibration cal) {
  std::lock_guard lock(mu_);
  cal_ = std::move(cal);
}

namespace {

void check_shape(const RequestShape& s) {
  if (s.n_tokens < 0 || s.n_reused < 0 || s.n_layers < 0 || s.first_check_layer < 0 ||
      s.n_reused > s.n_tokens)
    fail(ErrorCode::kInvalidArgument, "request shape: sizes must be >= 0 and n_reused <= n_tokens");
  for (const LayerLoadPart& p : s.loads)
    if (!(p.bytes_per_layer >= 0.0))
      fail(ErrorCode::kInvalidArgument, "request shape: bytes per layer must be >= 0");
}

// Keys a computed row sees on average: the selected rows spread over the
// request, and causal attention lets a row at position p see p + 1 keys.
double keys_per_row(const RequestShape& s) {
  return (static_cast<double>(s.n_tokens) + 1.0) / 2.0;
}

}  // namespace

double LoadingController::load_s_locked(const RequestShape& shape,
                                        const std::string* tier_override) const {
  double per_layer = 0.0;
  for (const LayerLoadPart& p : shape.loads) {
    const CalibratedTier* t = cal_.find_tier(tier_override ? *tier_override : p.tier);
    const CalibratedDecode* d = p.codec ? cal_.find_decode(*p.codec) : nullptr;
    per_layer += load_seconds(p.bytes_per_layer, t ? t->tier : cache::StorageTier{},
                              d ? d->s_per_byte : 0.0);
  }
  return per_layer * static_cast<double>(shape.n_layers);
}

double LoadingController::compute_s_locked(const RequestShape& shape, double ratio) const {
  if (!cal_.compute) return 0.0;
  const ComputeCost& c = cal_.compute->cost;
  const double n = static_cast<double>(shape.n_tokens);
  const double keys = keys_per_row(shape);
  const int64_t full_layers = std::min(shape.first_check_layer, shape.n_layers);
  const double rows = static_cast<double>(shape.n_tokens - shape.n_reused) +
                      ratio * static_cast<double>(shape.n_reused);
  return static_cast<double>(full_layers) * c.layer_seconds(n, keys) +
         static_cast<double>(shape.n_layers - full_layers) * c.layer_seconds(rows, keys);
}

double LoadingController::predict_load_s(const RequestShape& shape) const {
  check_shape(shape);
  std::lock_guard lock(mu_);
  return load_s_locked(shape, nullptr);
}

double LoadingController::predict_compute_s(const RequestShape& shape, double ratio) const {
  check_shape(shape);
  std::lock_guard lock(mu_);
  return compute_s_locked(shape, ratio);
}

RatioChoice LoadingController::choose_ratio(const RequestShape& shape,
                                            std::optional<double> r_min) const {
  check_shape(shape);
  const double floor = r_min.value_or(opts_.r_min);
  if (!(floor >= 0.0 && floor <= 1.0)) fail(ErrorCode::kInvalidArgument, "r_min must be in [0, 1]");
  std::lock_guard lock(mu_);
  RatioChoice out;
  out.load_s = load_s_locked(shape, nullptr);
  out.calibrated = cal_.compute && cal_.compute->cost.valid();
  if (!out.calibrated) {
    out.r_star = out.ratio = floor;
    return out;
  }
  // T_recompute is linear in r: C(r) = C(0) + r * slope.
  const double c0 = compute_s_locked(shape, 0.0);
  const double slope = compute_s_locked(shape, 1.0) - c0;
  if (!shape.loads_overlap_recompute) {
    out.r_star = 0.0;
  } else if (slope > 0.0) {
    out.r_star = ((1.0 - opts_.hide_margin) * out.load_s - c0) / slope;
  } else {
    // Nothing to recompute (no reused tokens, or every layer is before the
    // first check): r changes nothing.
    out.r_star = 0.0;
  }
  out.ratio = std::clamp(std::max(floor, out.r_star), 0.0, 1.0);
  // Past the point where even recomputing everything hides nothing, reads
  // only add time: recompute every token instead.
  const double reuse_cost =
      shape.loads_overlap_recompute ? out.load_s : out.load_s + c0 + out.ratio * slope;
  if (shape.n_reused > 0 && reuse_cost > c0 + slope) {
    out.skip_loads = true;
    out.ratio = 1.0;
  }
  out.compute_s = compute_s_locked(shape, out.ratio);
  return out;
}

std::optional<TierChoice> LoadingController::cheapest_hidden_tier(const RequestShape& shape,
                                                                  double ratio) const {
  check_shape(shape);
  std::lock_guard lock(mu_);
  if (cal_.tiers.empty() || !cal_.compute || !cal_.compute->cost.valid()) return std::nullopt;
  const double compute = compute_s_locked(shape, ratio);
  std::vector<TierChoice> options;
  for (const CalibratedTier& t : cal_.tiers) {
    const double load = load_s_locked(shape, &t.tier.name);
    options.push_back({t.tier, load, compute, (1.0 - opts_.hide_margin) * load <= compute});
  }
  return options[*pick_cheapest_hidden(options)];
}

void LoadingController::observe_fusion(const RequestShape& shape, const FusionStats& st) {
  check_shape(shape);
  const double keys = keys_per_row(shape);
  std::vector<LayerTiming> layers;
  const size_t n = std::min(st.layer_ms.size(), st.rows_per_layer.size());
  for (size_t l = 0; l < n; ++l) {
    // A check layer projects more rows than it carries on; skip it.
    if (l > 0 && st.rows_per_layer[l] != st.rows_per_layer[l - 1]) continue;
    // Layer 0 narrower than the request is a check at layer 0 or a reuse
    // mode; only the former projects rows it drops, but the two cannot be
    // told apart here, so neither is used.
    if (l == 0 && st.rows_per_layer[0] != st.n_tokens) continue;
    layers.push_back({static_cast<double>(st.rows_per_layer[l]), keys, st.layer_ms[l] * 1e-3});
  }
  std::lock_guard lock(mu_);
  refresh_compute(cal_, layers, opts_.refresh_alpha);
}

void LoadingController::observe_store(const std::string& tier, const cache::ReadCounters& before,
                                      const cache::ReadCounters& after) {
  if (after.bytes_read <= before.bytes_read) return;
  const double bytes = static_cast<double>(after.bytes_read - before.bytes_read);
  const double read_s = static_cast<double>(after.read_ns - before.read_ns) * 1e-9;
  int decoded = -1, n_codecs = 0;
  for (size_t c = 0; c < after.codec.size(); ++c)
    if (after.codec[c].layers > before.codec[c].layers) {
      decoded = static_cast<int>(c);
      ++n_codecs;
    }
  std::lock_guard lock(mu_);
  refresh_read(cal_, tier, bytes, read_s, opts_.refresh_alpha);
  if (n_codecs == 1) {
    const double decode_s =
        static_cast<double>(after.codec[decoded].decode_ns - before.codec[decoded].decode_ns) *
        1e-9;
    refresh_decode(cal_, static_cast<cache::Codec>(decoded), bytes, decode_s, opts_.refresh_alpha);
  }
}

Calibration load_or_probe_compute(CalibrationDb& db, const std::string& device, Session& scratch,
                                  const ComputeProbe& probe) {
  const std::string& model = scratch.model().fingerprint();
  Calibration cal = db.load(device, model);
  // A stored model that predicts nothing (a probe that saw no per-row cost)
  // is measured again: the controller cannot use it.
  if (!cal.compute || (!cal.compute->pinned && !cal.compute->cost.valid())) {
    cal.compute = CalibratedCompute{probe_compute_cost(scratch, probe), 0, false};
    db.save(device, model, cal);
  }
  return cal;
}

StoreProbe calibrate_tier(Calibration& cal, const std::string& name, int cost_rank,
                          cache::FlashStore& store, const cache::ChunkHandle& handle) {
  StoreProbe p = probe_store_load(store, handle);
  const CalibratedTier* t = cal.find_tier(name);
  if (!t || !t->pinned) cal.set_tier({{name, p.read_bytes_per_s, cost_rank}, 0, false});
  const CalibratedDecode* d = cal.find_decode(p.codec);
  if (!d || !d->pinned) cal.set_decode({p.codec, p.decode_s_per_byte, 0, false});
  return p;
}

}  // namespace cb
