// Which reused tokens a check layer keeps, given each candidate's score: a
// pure policy apart from how the scores are measured (the fusor measures
// them: KV deviation, attention mass, a seeded draw).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cb {

struct TokenChoice {
  std::vector<int32_t> chosen;  // candidate indices, ascending
  // The chosen tokens' share of the candidates' total score (1 when the
  // total is 0 or every candidate is chosen).
  double share = 1.0;
  bool raised = false;  // the guard added tokens beyond `k`
};

// The k highest-scoring candidates (equal scores: the lower index first, so
// the choice is deterministic).  Guard: while the chosen hold less than
// `min_share` of the total score and fewer than `max_k` are chosen, the next
// best is added.  Negative and non-finite scores count as 0 in the share.
// 0 <= k <= scores.size(); max_k is clamped to [k, scores.size()].
TokenChoice choose_tokens(std::span<const float> scores, int64_t k, double min_share = 0.0,
                          int64_t max_k = 0);

}  // namespace cb
