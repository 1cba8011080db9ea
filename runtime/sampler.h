// Next-token choice from logits: greedy, or temperature + top-k + top-p with
// a seeded generator so a run can be reproduced.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace cb {

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // <= 0: no top-k cut
  float top_p = 1.0f;        // >= 1: no nucleus cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws cb::Error(kInvalidArgument) for NaN temperature or top_p outside (0, 1].
  explicit Sampler(const SamplerOptions& opts);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace cb
