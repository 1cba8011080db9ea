#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "platform/error.h"
#include "runtime/sampler.h"

namespace cb {
namespace {

TEST(Sampler, GreedyPicksTheMaximumAndLowestIdOnTies) {
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(argmax(l), 1);
  Sampler s({});
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, SeededSamplingIsReproducible) {
  std::vector<float> l = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplerOptions o{.temperature = 1.0f, .seed = 42};
  Sampler a(o), b(o);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l), b.sample(l));
}

TEST(Sampler, TopKOnlyDrawsFromTheKBest) {
  std::vector<float> l = {5.0f, 4.9f, 0.0f, 4.8f, -2.0f};
  Sampler s({.temperature = 5.0f, .top_k = 2, .seed = 1});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[s.sample(l)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Probabilities ~ {0.64, 0.24, 0.09, 0.03}: top_p 0.8 keeps two tokens.
  std::vector<float> l = {3.0f, 2.0f, 1.0f, 0.0f};
  Sampler s({.temperature = 1.0f, .top_p = 0.8f, .seed = 3});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 1000; ++i) ++seen[s.sample(l)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], seen[1]);
}

TEST(Sampler, TemperatureFollowsTheSoftmax) {
  std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  Sampler s({.temperature = 1.0f, .seed = 7});
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(l);
  EXPECT_NEAR(ones / double(n), 0.75, 0.02);
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(Sampler({.top_p = 0.0f}), Error);
  EXPECT_THROW(Sampler({.top_p = 1.5f}), Error);
  EXPECT_THROW(Sampler({.temperature = NAN}), Error);
  EXPECT_THROW(Sampler({.min_p = 1.0f}), Error);
  EXPECT_THROW(Sampler({.min_p = -0.1f}), Error);
  EXPECT_THROW(Sampler({.repeat_penalty = 0.0f}), Error);
  EXPECT_THROW(Sampler({.repeat_penalty = INFINITY}), Error);
  EXPECT_THROW(Sampler({.repeat_last_n = -1}), Error);
  EXPECT_THROW(argmax({}), Error);
}

// min_p keeps the tokens at least min_p times as likely as the best one:
// p ~ {0.53, 0.20, 0.20, 0.07}; min_p 0.3 keeps the first three.
TEST(Sampler, MinPDropsTheUnlikelyTail) {
  std::vector<float> l = {2.0f, 1.0f, 1.0f, 0.0f};
  Sampler s({.temperature = 1.0f, .min_p = 0.3f, .seed = 5});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(l)];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_GT(seen[0], seen[1]);
}

// The penalty divides a positive logit, multiplies a negative one, once per
// distinct recent token, and forgets tokens older than repeat_last_n.
TEST(Sampler, RepeatPenaltyDampsRecentTokens) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.05f};
  Sampler s({.repeat_penalty = 1.5f, .repeat_last_n = 2});
  EXPECT_EQ(s.sample(l), 0);
  s.accept(0);
  s.accept(0);  // counted once: 2.0 / 1.5 = 1.33 < 1.9
  EXPECT_EQ(s.sample(l), 1);
  s.accept(1);  // history {0, 1}: 1.33 and 1.27 vs -1.0
  EXPECT_EQ(s.sample(l), 0);
  const std::vector<float> neg = {-1.0f, -1.2f};
  Sampler t({.repeat_penalty = 1.5f, .repeat_last_n = 1});
  t.accept(0);  // -1.0 * 1.5 = -1.5 < -1.2
  EXPECT_EQ(t.sample(neg), 1);
  t.accept(1);  // 0 left the window of one
  EXPECT_EQ(t.sample(neg), 0);
  Sampler off({.repeat_penalty = 1.0f});
  off.accept(0);
  EXPECT_EQ(off.sample(l), 0);
}

// NaN or +inf logits (a model with non-finite weights) are an error, greedy
// or sampled; -inf marks a token that cannot be chosen.
TEST(Sampler, NonFiniteLogitsAreAnError) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float temperature : {0.0f, 0.8f}) {
    Sampler s({.temperature = temperature});
    EXPECT_THROW(s.sample(std::vector<float>{0.5f, NAN, 1.0f}), Error);
    EXPECT_THROW(s.sample(std::vector<float>{0.5f, inf}), Error);
    EXPECT_EQ(s.sample(std::vector<float>{-inf, 2.0f, -inf}), 1);
  }
}

}  // namespace
}  // namespace cb
