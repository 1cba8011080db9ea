#include "cache/eviction.h"

namespace cb::cache {

std::optional<size_t> plan_eviction(uint64_t used, uint64_t incoming, uint64_t capacity,
                                    std::span<const EvictionCandidate> lru_first) {
  if (incoming > capacity) return std::nullopt;
  const uint64_t budget = capacity - incoming;  // what may stay
  size_t n = 0;
  while (used > budget) {
    if (n == lru_first.size()) return std::nullopt;
    // An index that was edited by hand could report fewer total bytes than one
    // entry holds; never wrap around.
    used -= lru_first[n].bytes < used ? lru_first[n].bytes : used;
    ++n;
  }
  return n;
}

}  // namespace cb::cache
