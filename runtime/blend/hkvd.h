// Selection of the high-KV-deviation (HKVD) tokens: the reused tokens whose
// cached KV differs most from what a full prefill gives, and so the ones worth
// recomputing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cb {

// Indices of the k largest values of `deviation`, in increasing index order.
// Ties go to the lower index, so the choice is deterministic.  k is clamped to
// [0, deviation.size()].
std::vector<int32_t> select_hkvd_tokens(std::span<const float> deviation, int64_t k);

}  // namespace cb
