#include "runtime/blend/cost_model.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "cache/flash_store.h"
#include "platform/error.h"
#include "runtime/session.h"

namespace cb {
namespace {

constexpr int kTerms = 3;

std::array<double, kTerms> features(const LayerTiming& t) {
  return {t.rows, t.rows * t.keys_per_row, 1.0};
}

// Solves the normal equations restricted to the terms in `mask` by Gaussian
// elimination with partial pivoting; false if they are singular.
bool solve_subset(std::span<const LayerTiming> samples, unsigned mask,
                  std::array<double, kTerms>& coef) {
  std::array<int, kTerms> idx{};
  int n = 0;
  for (int j = 0; j < kTerms; ++j)
    if (mask & (1u << j)) idx[n++] = j;
  double a[kTerms][kTerms + 1] = {};
  // Columns are scaled to unit norm first: rows and rows*keys differ by
  // orders of magnitude, and the unscaled system loses all precision.
  std::array<double, kTerms> scale{};
  for (const LayerTiming& t : samples) {
    auto f = features(t);
    for (int j = 0; j < kTerms; ++j) scale[j] += f[j] * f[j];
  }
  for (double& s : scale) s = s > 0 ? std::sqrt(s) : 1.0;
  for (const LayerTiming& t : samples) {
    auto f = features(t);
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < n; ++c) a[r][c] += f[idx[r]] / scale[idx[r]] * f[idx[c]] / scale[idx[c]];
      a[r][n] += f[idx[r]] / scale[idx[r]] * t.seconds;
    }
  }
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    if (std::abs(a[p][c]) < 1e-12) return false;
    for (int k = 0; k <= n; ++k) std::swap(a[c][k], a[p][k]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double m = a[r][c] / a[c][c];
      for (int k = c; k <= n; ++k) a[r][k] -= m * a[c][k];
    }
  }
  coef = {};
  for (int r = 0; r < n; ++r) coef[idx[r]] = a[r][n] / a[r][r] / scale[idx[r]];
  return true;
}

}  // namespace

ComputeCost fit_compute_cost(std::span<const LayerTiming> samples) {
  if (samples.empty()) fail(ErrorCode::kInvalidArgument, "no layer timings to fit");
  // Three terms: trying every subset and keeping the best fit whose
  // coefficients are all nonnegative is exact nonnegative least squares.
  double best_err = std::numeric_limits<double>::infinity();
  std::array<double, kTerms> best{};
  for (unsigned mask = 1; mask < (1u << kTerms); ++mask) {
    std::array<double, kTerms> coef{};
    if (!solve_subset(samples, mask, coef)) continue;
    if (std::any_of(coef.begin(), coef.end(), [](double c) { return c < 0.0; })) continue;
    double err = 0.0;
    for (const LayerTiming& t : samples) {
      auto f = features(t);
      const double pred = std::inner_product(f.begin(), f.end(), coef.begin(), 0.0);
      err += (pred - t.seconds) * (pred - t.seconds);
    }
    if (err < best_err) {
      best_err = err;
      best = coef;
    }
  }
  return {best[0], best[1], best[2]};
}

namespace {

// One round of the compute probe: a sample per (m, p), contexts in
// ascending order, rows in the caller's order within each.
std::vector<LayerTiming> probe_round(Session& s, std::span<const int32_t> tokens,
                                     std::span<const int64_t> rows,
                                     std::span<const int64_t> contexts, int repeats,
                                     const std::function<double()>& clock) {
  const double n_layer = static_cast<double>(s.model().hparams().n_layer);
  std::vector<LayerTiming> out;
  for (int64_t p : contexts) {
    s.truncate(0);
    if (p > 0) s.prefill(tokens.first(static_cast<size_t>(p)));
    for (int64_t m : rows) {
      double best = std::numeric_limits<double>::infinity();
      for (int rep = 0; rep < repeats; ++rep) {
        s.truncate(p);
        const double t0 = clock();
        s.prefill(tokens.subspan(static_cast<size_t>(p), static_cast<size_t>(m)));
        best = std::min(best, clock() - t0);
      }
      // Row i (0-based) of the m new rows sees p + i + 1 keys.
      out.push_back(
          {static_cast<double>(m), static_cast<double>(p) + (m + 1) / 2.0, best / n_layer});
    }
  }
  s.truncate(0);
  return out;
}

// Whether a round's most rows took kRowsVisible times the fewest rows'
// time, at its first (smallest) context.
bool rows_visible(std::span<const LayerTiming> round, size_t n_rows) {
  const auto first = round.first(n_rows);
  const auto [lo, hi] = std::minmax_element(
      first.begin(), first.end(),
      [](const LayerTiming& a, const LayerTiming& b) { return a.rows < b.rows; });
  return hi->seconds >= ComputeProbe::kRowsVisible * lo->seconds && hi->seconds > 0.0;
}

}  // namespace

ComputeCost probe_compute_cost(Session& s, const ComputeProbe& probe,
                               std::vector<LayerTiming>* samples) {
  if (s.n_past() != 0)
    fail(ErrorCode::kInvalidArgument, "the compute probe needs an empty session");
  if (probe.rows.empty() || probe.contexts.empty() || probe.repeats < 1 || probe.max_growth < 0)
    fail(ErrorCode::kInvalidArgument,
         "the compute probe needs rows, contexts, repeats >= 1 and max_growth >= 0");
  std::vector<int64_t> rows = probe.rows;
  int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  const int64_t max_ctx = *std::max_element(probe.contexts.begin(), probe.contexts.end());
  if (*std::min_element(rows.begin(), rows.end()) < 1 ||
      *std::min_element(probe.contexts.begin(), probe.contexts.end()) < 0)
    fail(ErrorCode::kInvalidArgument, "compute probe sizes must be positive");
  const int64_t n_ctx = s.n_ctx();
  if (max_rows + max_ctx > n_ctx)
    fail(ErrorCode::kInvalidArgument,
         "the compute probe needs a context of " + std::to_string(max_rows + max_ctx) + " tokens");
  const auto& hp = s.model().hparams();
  // Token ids do not change the cost of a dense forward pass; a fixed,
  // varied sequence keeps the probe deterministic.
  std::vector<int32_t> tokens(static_cast<size_t>(n_ctx));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(hp.n_vocab));
  const std::function<double()> clock = probe.clock ? probe.clock : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::vector<int64_t> contexts = probe.contexts;
  std::sort(contexts.begin(), contexts.end());
  // The first forward pass also maps and prepares the weights (on a
  // CPU, the 1.5B model's first 16 rows took 2x what 96 did after it).
  s.prefill(
      std::span(tokens).first(static_cast<size_t>(*std::min_element(rows.begin(), rows.end()))));
  s.truncate(0);
  std::vector<LayerTiming> all, round;
  for (int growth = 0;; ++growth) {
    round = probe_round(s, tokens, rows, contexts, probe.repeats, clock);
    all.insert(all.end(), round.begin(), round.end());
    if (rows_visible(round, rows.size())) break;
    if (growth == probe.max_growth || 4 * max_rows > n_ctx) {
      // The rows never showed: all of the time per row, an upper bound.
      double per_row = std::numeric_limits<double>::infinity();
      for (const LayerTiming& t : round) per_row = std::min(per_row, t.seconds / t.rows);
      if (samples) *samples = all;
      return {std::max(per_row, 0.0), 0.0, 0.0};
    }
    for (int64_t& m : rows) m *= 4;
    max_rows *= 4;
    for (int64_t& p : contexts) p = std::min(p, n_ctx - max_rows);
    contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  }
  if (samples) *samples = all;
  return fit_compute_cost(round);
}

double load_seconds(double bytes, const cache::StorageTier& tier, double decode_s_per_byte) {
  const double read = tier.read_bytes_per_s > 0.0 ? bytes / tier.read_bytes_per_s : 0.0;
  return read + bytes * decode_s_per_byte;
}

StoreProbe probe_store_load(cache::FlashStore& store, const cache::ChunkHandle& handle) {
  const size_t n = static_cast<size_t>(handle.shape().layer_floats());
  std::vector<float> k(n), v(n);
  const cache::StoreStats before = store.stats();
  for (int l = 0; l < handle.n_layers(); ++l)
    if (!store.fetch_layer(handle, l, k.data(), v.data()))
      fail(ErrorCode::kIo, "store probe: layer " + std::to_string(l) + " could not be read");
  const cache::StoreStats after = store.stats();
  const int c = static_cast<int>(handle.codec());
  StoreProbe p;
  p.codec = handle.codec();
  p.bytes = after.bytes_read - before.bytes_read;
  const double read_s = static_cast<double>(after.read_ns - before.read_ns) * 1e-9;
  const double decode_s =
      static_cast<double>(after.codec[c].decode_ns - before.codec[c].decode_ns) * 1e-9;
  // A read served from the page cache can take "no" time at the clock's
  // resolution; report it as very fast rather than infinite.
  p.read_bytes_per_s = static_cast<double>(p.bytes) / std::max(read_s, 1e-9);
  p.decode_s_per_byte = p.bytes ? decode_s / static_cast<double>(p.bytes) : 0.0;
  return p;
}

}  // namespace cb
