#include "runtime/blend/hkvd.h"

#include <algorithm>
#include <numeric>

namespace cb {

std::vector<int32_t> select_hkvd_tokens(std::span<const float> deviation, int64_t k) {
  const int64_t n = static_cast<int64_t>(deviation.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // Larger deviation first; equal deviations by index.  nth_element is enough:
  // the selected set, not its internal order, matters, and it is re-sorted.
  auto larger = [&](int32_t a, int32_t b) {
    return deviation[a] > deviation[b] || (deviation[a] == deviation[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), larger);
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace cb
