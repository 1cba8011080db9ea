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

void check_logits(std::span<const float> logits) {
  for (float v : logits) {
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity())
      fail(ErrorCode::kFormat,
           "the model produced non-finite logits (NaN or infinite weights, or an overflow)");
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  check_logits(logits);
  logits = penalized(logits);
  if (opts_.temperature <= 0.0f) return argmax(logits);
  const size_t n = logits.size();
  if (n == 0) fail(ErrorCode::kInvalidArgument, "sampling from no logits");
  // Nothing here sorts the whole vocabulary (a 152k-token one took ~10 ms
  // per token that way): top-k selects its k in linear time, min-p is a
  // threshold, and top-p sorts only as far into the candidates as its
  // nucleus reaches.  The draw walks the candidates in a fixed order (the
  // nucleus's descending order, else the selection's), so a seed always
  // gives the same token.
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  scratch_.resize(n);
  for (size_t i = 0; i < n; ++i) scratch_[i] = {logits[i], static_cast<int32_t>(i), 0.0};
  if (opts_.top_k > 0 && static_cast<size_t>(opts_.top_k) < n) {
    const auto kth = scratch_.begin() + opts_.top_k;
    std::nth_element(scratch_.begin(), kth - 1, scratch_.end(), better);
    scratch_.resize(static_cast<size_t>(opts_.top_k));
  }
  // Weights at the temperature, relative to the most likely token's (1), in
  // double for a stable cumulative sum.
  float top = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : scratch_) top = std::max(top, c.logit);
  for (Candidate& c : scratch_)
    c.p = std::exp((static_cast<double>(c.logit) - top) / opts_.temperature);
  if (opts_.min_p > 0.0f) {
    std::erase_if(scratch_, [&](const Candidate& c) { return c.p < opts_.min_p; });
  }
  double sum = 0.0;
  for (const Candidate& c : scratch_) sum += c.p;
  if (opts_.top_p < 1.0f) {
    // The smallest prefix in descending order whose share reaches top_p:
    // sorted in growing steps, each step's best brought into order.
    const double want = static_cast<double>(opts_.top_p) * sum;
    double cum = 0.0;
    size_t keep = scratch_.size(), sorted = 0;
    while (sorted < scratch_.size()) {
      const size_t next = std::min(scratch_.size(), std::max<size_t>(64, 2 * sorted));
      std::partial_sort(scratch_.begin() + static_cast<std::ptrdiff_t>(sorted),
                        scratch_.begin() + static_cast<std::ptrdiff_t>(next), scratch_.end(),
                        better);
      for (; sorted < next; ++sorted) {
        cum += scratch_[sorted].p;
        if (cum >= want) {
          keep = sorted + 1;
          break;
        }
      }
      if (keep < scratch_.size() || cum >= want) break;
    }
    scratch_.resize(keep);
    sum = 0.0;
    for (const Candidate& c : scratch_) sum += c.p;
  }
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  for (const Candidate& c : scratch_) {
    r -= c.p;
    if (r < 0.0) return c.id;
  }
  return scratch_.back().id;
}

}  // namespace cb
