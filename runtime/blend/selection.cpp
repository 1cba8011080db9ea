#include "runtime/blend/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "platform/error.h"

namespace cb {

TokenChoice choose_tokens(std::span<const float> scores, int64_t k, double min_share,
                          int64_t max_k) {
  const int64_t n = static_cast<int64_t>(scores.size());
  if (k < 0 || k > n) fail(ErrorCode::kInvalidArgument, "choose_tokens: k is outside 0..n");
  max_k = std::clamp(max_k, k, n);
  auto weight = [&](int32_t i) {
    const float s = scores[static_cast<size_t>(i)];
    return std::isfinite(s) && s > 0.0f ? static_cast<double>(s) : 0.0;
  };
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Best first (NaN last); only the first max_k places matter.
  std::vector<float> key(scores.begin(), scores.end());
  for (float& s : key)
    if (std::isnan(s)) s = -INFINITY;
  auto better = [&](int32_t a, int32_t b) {
    const float sa = key[static_cast<size_t>(a)], sb = key[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + max_k, order.end(), better);
  double total = 0.0;
  for (int32_t i = 0; i < n; ++i) total += weight(i);
  double kept = 0.0;
  for (int64_t i = 0; i < k; ++i) kept += weight(order[static_cast<size_t>(i)]);
  TokenChoice c;
  int64_t m = k;
  while (m < max_k && total > 0.0 && kept < min_share * total) {
    kept += weight(order[static_cast<size_t>(m++)]);
    c.raised = true;
  }
  c.share = total > 0.0 && m < n ? kept / total : 1.0;
  c.chosen.assign(order.begin(), order.begin() + m);
  std::sort(c.chosen.begin(), c.chosen.end());
  return c;
}

}  // namespace cb
