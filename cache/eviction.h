// LRU eviction policy, kept apart from SQLite so it can be tested on its own.
// The index feeds it the unpinned entries, least recently used first.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace cb::cache {

struct EvictionCandidate {
  int64_t id = 0;
  uint64_t bytes = 0;
};

// How many leading candidates must go so that used + incoming <= capacity,
// or nullopt if evicting all of them is still not enough (the rest is pinned,
// or incoming alone exceeds capacity).  0 when it already fits.
std::optional<size_t> plan_eviction(uint64_t used, uint64_t incoming, uint64_t capacity,
                                    std::span<const EvictionCandidate> lru_first);

}  // namespace cb::cache
