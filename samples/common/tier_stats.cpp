#include "tier_stats.h"

namespace cbs {

cb_status read_tier_stats(const cb_chunk_cache* cache, std::vector<cb_tier_stats>& out) {
  out.clear();
  size_t n = 0;
  if (cb_status s = cb_chunk_cache_n_tiers(cache, &n); s != CB_OK) return s;
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    cb_tier_stats_init(&out[i]);
    if (cb_status s = cb_chunk_cache_get_tier_stats(cache, i, &out[i]); s != CB_OK) return s;
  }
  return CB_OK;
}

}  // namespace cbs
