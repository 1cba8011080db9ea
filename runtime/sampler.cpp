#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "platform/error.h"

namespace cb {

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail(ErrorCode::kInvalidArgument, "argmax of no logits");
  // max_element returns the first maximum: the lowest id wins ties.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerOptions& opts) : opts_(opts), rng_(opts.seed) {
  if (std::isnan(opts.temperature) || !std::isfinite(opts.temperature))
    fail(ErrorCode::kInvalidArgument, "temperature must be a finite number");
  if (!(opts.top_p > 0.0f && opts.top_p <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "top_p must be in (0, 1]");
  if (!(opts.min_p >= 0.0f && opts.min_p < 1.0f))
    fail(ErrorCode::kInvalidArgument, "min_p must be in [0, 1)");
  if (!(opts.repeat_penalty > 0.0f && std::isfinite(opts.repeat_penalty)))
    fail(ErrorCode::kInvalidArgument, "repeat_penalty must be a positive number (1: none)");
  if (opts.repeat_last_n < 0)
    fail(ErrorCode::kInvalidArgument, "repeat_last_n must be >= 0 (0: no repetition penalty)");
}

void Sampler::accept(int32_t token) {
  if (opts_.repeat_last_n == 0 || opts_.repeat_penalty == 1.0f) return;
  recent_.push_back(token);
  if (recent_.size() > static_cast<size_t>(opts_.repeat_last_n)) recent_.pop_front();
}

std::span<const float> Sampler::penalized(std::span<const float> logits) {
  if (recent_.empty()) return logits;
  penalized_.assign(logits.begin(), logits.end());
  // Once per distinct token, however often it recurs (as llama.cpp's
  // repeat penalty does).
  std::vector<int32_t> seen(recent_.begin(), recent_.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for (int32_t t : seen) {
    if (t < 0 || static_cast<size_t>(t) >= penalized_.size()) continue;
    float& v = penalized_[static_cast<size_t>(t)];
    v = v > 0.0f ? v / opts_.repeat_penalty : v * opts_.repeat_penalty;
  }
  return penalized_;
}

int32_t Sampler::sample(std::span<const float> logits) {
  // -inf is a masked token; NaN or +inf means the forward pass broke down
  // (NaN or infinite weights, an overflow), and no token can be chosen.
  for (float v : logits) {
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity())
      fail(ErrorCode::kFormat,
           "the model produced non-finite logits (NaN or infinite weights, or an overflow)");
  }
  logits = penalized(logits);
  if (opts_.temperature <= 0.0f) return argmax(logits);
  const size_t n = logits.size();
  if (n == 0) fail(ErrorCode::kInvalidArgument, "sampling from no logits");
  scratch_.resize(n);
  for (size_t i = 0; i < n; ++i) scratch_[i] = {logits[i], static_cast<int32_t>(i)};
  // Order by logit (descending), ids ascending on ties, so a seed always
  // gives the same choice whatever the sort's internal order.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t k = opts_.top_k > 0 ? std::min(n, static_cast<size_t>(opts_.top_k)) : n;
  std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k),
                    scratch_.end(), better);
  scratch_.resize(k);

  // Softmax at the temperature, in double for a stable cumulative sum.
  std::vector<double> p(k);
  const double top = scratch_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((scratch_[i].first - top) / opts_.temperature);
    sum += p[i];
  }
  size_t keep = k;
  if (opts_.min_p > 0.0f) {
    // p[0] is the most likely token's weight, exactly 1.
    while (keep > 1 && p[keep - 1] < opts_.min_p) --keep;
    sum = 0.0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  if (opts_.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= opts_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += p[i];
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0.0) return scratch_[i].second;
  }
  return scratch_[keep - 1].second;
}

}  // namespace cb
