// Every storage tier's counters of a chunk cache, in tier order (none for a
// cache in RAM): what the samples report per tier.
#pragma once

#include <vector>

#include "cacheblend/cacheblend.h"

namespace cbs {

// Fills `out` (emptied first); the first failing call's status, else CB_OK.
cb_status read_tier_stats(const cb_chunk_cache* cache, std::vector<cb_tier_stats>& out);

}  // namespace cbs
