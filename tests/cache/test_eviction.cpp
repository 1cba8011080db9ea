#include "cache/eviction.h"

#include <gtest/gtest.h>

#include <vector>

namespace cb::cache {
namespace {

TEST(PlanEviction, NothingWhenItFits) {
  const std::vector<EvictionCandidate> c = {{1, 10}, {2, 10}};
  EXPECT_EQ(plan_eviction(20, 80, 100, c), 0u);
}

TEST(PlanEviction, EvictsOldestFirstUntilItFits) {
  const std::vector<EvictionCandidate> c = {{1, 10}, {2, 30}, {3, 10}};
  EXPECT_EQ(plan_eviction(50, 60, 100, c), 1u);  // 40 + 60
  EXPECT_EQ(plan_eviction(50, 61, 100, c), 2u);  // 10 + 61
  EXPECT_EQ(plan_eviction(50, 100, 100, c), 3u);
}

TEST(PlanEviction, ImpossibleWhenPinnedBytesRemainOrTooLarge) {
  // used 50 includes 20 pinned bytes not in the candidate list.
  const std::vector<EvictionCandidate> c = {{1, 10}, {2, 20}};
  EXPECT_FALSE(plan_eviction(50, 90, 100, c));
  EXPECT_EQ(plan_eviction(50, 80, 100, c), 2u);
  EXPECT_FALSE(plan_eviction(0, 101, 100, {}));
}

TEST(PlanEviction, InconsistentTotalsDoNotWrap) {
  const std::vector<EvictionCandidate> c = {{1, 500}};
  EXPECT_EQ(plan_eviction(200, 10, 100, c), 1u);
}

}  // namespace
}  // namespace cb::cache
