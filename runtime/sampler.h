// Next-token choice from logits: greedy, or temperature + top-k + min-p +
// top-p with a seeded generator so a run can be reproduced; either after a
// repetition penalty on the tokens generated so far.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

namespace cb {

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // <= 0: no top-k cut
  float top_p = 1.0f;        // >= 1: no nucleus cut
  // Sampling only: drops the tokens less likely (at the temperature) than
  // min_p times the most likely one; 0: no cut.  In [0, 1).
  float min_p = 0.0f;
  // Each distinct token among the last repeat_last_n accepted ones has its
  // logit divided by repeat_penalty when positive, multiplied when negative
  // (greedy and sampled alike); 1: none.  > 0; repeat_last_n >= 0.
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;
};

// Throws cb::Error(kFormat) when `logits` hold NaN or +inf: the forward pass
// broke down (NaN or infinite weights, an overflow) and no token can be
// chosen.  -inf is a masked token.  The rule for every call that hands out
// logits to sample from (generation, a RAG prefill).
void check_logits(std::span<const float> logits);

class Sampler {
 public:
  // Throws cb::Error(kInvalidArgument) for a non-finite temperature, top_p
  // outside (0, 1], min_p outside [0, 1), repeat_penalty <= 0 or not finite,
  // or repeat_last_n < 0.
  explicit Sampler(const SamplerOptions& opts);
  int32_t sample(std::span<const float> logits);
  // A token that entered the text (the repetition penalty's history).
  void accept(int32_t token);

 private:
  // The logits after the repetition penalty (`logits` itself when none applies).
  std::span<const float> penalized(std::span<const float> logits);

  SamplerOptions opts_;
  std::mt19937_64 rng_;
  struct Candidate {
    float logit;
    int32_t id;
    double p;  // weight at the temperature, relative to the most likely token
  };
  std::vector<Candidate> scratch_;
  std::deque<int32_t> recent_;
  std::vector<float> penalized_;
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace cb
