#include "runtime/blend/hkvd.h"

#include <algorithm>

#include "kernels/backend.h"

namespace cb {

std::vector<int32_t> select_hkvd_tokens(std::span<const float> deviation, int64_t k) {
  const int64_t n = static_cast<int64_t>(deviation.size());
  std::vector<int32_t> idx(static_cast<size_t>(std::clamp<int64_t>(k, 0, n)));
  top_k_indices(deviation.data(), n, static_cast<int64_t>(idx.size()), idx.data());
  return idx;
}

}  // namespace cb
