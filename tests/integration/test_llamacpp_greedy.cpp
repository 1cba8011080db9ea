// Greedy continuations against llama.cpp on the same GGUF
// (tests/golden/llamacpp.json, made by scripts/regen_goldens.sh).  llama.cpp
// quantizes activations to 8 bits and keeps its KV cache in f16, so its
// logits differ from ours by ~1e-2 relative: where two candidates are within
// that noise the argmax may legitimately flip.  The test therefore requires
// (a) at least 5 prompts to match token for token over all 32 steps, and
// (b) every divergence to be a near-tie: our token is llama.cpp's runner-up
// and its top-two logits differ by less than kNearTie.
// That holds for our f32 decode path (SessionOptions::int8_decode = false),
// whose logits track a float64 reference to ~1e-6.  The default decode path
// quantizes activations to int8 as llama.cpp does, but with its own rounding
// flips (and f32 rather than f16 KV), so its logits sit ~3e-2 relative from
// the f32 ones, on another side of llama.cpp's: at a three-way near-tie our
// choice may be a token outside llama.cpp's top two.  For that path a
// divergence must be a near-tie in our own logits (llama.cpp's token within
// kNearTie of ours), and at least 4 prompts must match all the way.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/chat_format.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

constexpr double kNearTie = 0.5;  // logits; llama.cpp's own noise is ~0.1-0.3 here

// Returns how many prompts matched over every step; checks each divergence.
int greedy_against_golden(bool int8_decode) {
  std::ifstream in(CB_SOURCE_DIR "/tests/golden/llamacpp.json");
  EXPECT_TRUE(in) << "missing tests/golden/llamacpp.json (scripts/regen_goldens.sh makes it)";
  if (!in) return 0;
  auto golden = nlohmann::json::parse(in);
  auto model = Model::load(test::model_path());
  int exact = 0;
  for (const auto& g : golden["greedy"]) {
    const std::string name = g["name"];
    auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    auto expect = g["ids"].get<std::vector<int32_t>>();
    Session s(*model, {.n_ctx = 512, .n_threads = 2, .int8_decode = int8_decode});
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
        if (int8_decode) {
          EXPECT_LT(our_margin, kNearTie) << name << " step " << step << " is not a near-tie";
        } else {
          EXPECT_EQ(ours, top2["ids"][1].get<int32_t>()) << name << " step " << step;
          EXPECT_LT(margin, kNearTie) << name << " step " << step << " is not a near-tie";
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

TEST(LlamaCppGolden, GreedyContinuationsMatch) {
  EXPECT_GE(greedy_against_golden(/*int8_decode=*/false), 5);
}

TEST(LlamaCppGolden, GreedyContinuationsMatchWithInt8Decode) {
  EXPECT_GE(greedy_against_golden(/*int8_decode=*/true), 4);
}

TEST(LlamaCppGolden, ChatAnswerNamesParis) {
  std::ifstream in(CB_SOURCE_DIR "/tests/golden/llamacpp.json");
  auto golden = nlohmann::json::parse(in);
  auto model = Model::load(test::model_path());
  std::vector<ChatMessage> chat = {{"user", "What is the capital of France?"}};
  auto ids = model->tokenizer().encode(format_chat(ChatFormat::kChatML, chat, true), false, true);
  Session s(*model, {.n_ctx = 256, .n_threads = 2});
  auto logits = s.prefill(ids);
  std::vector<int32_t> out;
  for (int i = 0; i < 16; ++i) {
    int32_t t = argmax(logits);
    if (model->tokenizer().is_end_of_generation(t)) break;
    out.push_back(t);
    logits = s.decode(t);
  }
  std::string text = model->tokenizer().decode(out);
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
}

}  // namespace
}  // namespace cb
