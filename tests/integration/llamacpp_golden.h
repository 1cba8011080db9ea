// Greedy continuations against llama.cpp's golden file, shared by the tests
// of each model (see test_llamacpp_greedy.cpp for the rules).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace cb::test {

constexpr double kNearTie = 0.5;  // logits; llama.cpp's own noise is ~0.1-0.3 here

// How a divergence from llama.cpp is judged: by llama.cpp's logits (our
// token is its runner-up, within near_tie of its choice) or by ours
// (llama.cpp's token within near_tie of ours).
struct DivergenceRule {
  bool by_our_logits = false;
  double near_tie = kNearTie;
  // The oracle-grade comparisons keep the f32 cache; llama.cpp's own cache
  // is f16, which the default cache is compared with too.
  KvType kv_type = KvType::kF32;
};

// Returns how many prompts matched over every step; checks each divergence.
inline int greedy_against_golden(const std::string& golden_path, const std::string& model_path,
                                 bool int8_decode, DivergenceRule rule) {
  std::ifstream in(golden_path);
  EXPECT_TRUE(in) << "missing " << golden_path << " (scripts/regen_goldens.sh makes it)";
  if (!in) return 0;
  auto golden = nlohmann::json::parse(in);
  auto model = Model::load(model_path);
  int exact = 0;
  for (const auto& g : golden["greedy"]) {
    const std::string name = g["name"];
    auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    auto expect = g["ids"].get<std::vector<int32_t>>();
    // int8 decode goes with int8 prefill (llama.cpp's arithmetic); the f32
    // path keeps both exact.
    Session s(*model, {.n_ctx = 512,
                       .n_threads = 2,
                       .int8_decode = int8_decode,
                       .int8_prefill = int8_decode,
                       .kv_type = rule.kv_type});
    auto logits = s.prefill(prompt);
    size_t step = 0;
    for (; step < expect.size(); ++step) {
      int32_t ours = argmax(logits);
      if (ours != expect[step]) {
        const auto& top2 = g["top2"][step];
        double margin = top2["logits"][0].get<double>() - top2["logits"][1].get<double>();
        const double our_margin = logits[ours] - logits[expect[step]];
        std::printf(
            "  %-16s diverges at step %zu: ours %d, llama.cpp %d (runner-up %d, margin %.3f; "
            "our margin %.3f)\n",
            name.c_str(), step, ours, expect[step], top2["ids"][1].get<int>(), margin, our_margin);
        if (rule.by_our_logits) {
          EXPECT_LT(our_margin, rule.near_tie) << name << " step " << step << " is not a near-tie";
        } else {
          EXPECT_EQ(ours, top2["ids"][1].get<int32_t>()) << name << " step " << step;
          EXPECT_LT(margin, rule.near_tie) << name << " step " << step << " is not a near-tie";
        }
        break;
      }
      if (step + 1 < expect.size()) logits = s.decode(ours);
    }
    if (step == expect.size()) {
      ++exact;
      std::printf("  %-16s all %zu tokens equal\n", name.c_str(), expect.size());
    }
  }
  return exact;
}

}  // namespace cb::test
