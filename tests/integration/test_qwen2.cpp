// The real Qwen2.5-Coder 0.5B Instruct (Q4_K_M: Q5_0, Q8_0, Q4_K and Q6_K
// tensors; fetched by scripts/setup.sh) against its oracles.  The float64
// reference (CTest oracle_qwen05_reference) on the golden prompts and at
// every point where llama.cpp's greedy continuation parts from the
// reference's (tests/oracle/reference_divergences.py): last-position logits
// within 1e-3 relative L2 and the same argmax with exact arithmetic, within
// 0.2 with the default session's int8 activations.
// llama.cpp on the same file (tests/golden/llamacpp_qwen2_0.5b.json, written
// by tests/oracle/llamacpp_golden.py --prompt-set qwen --tokenize-set qwen
// --chat-template): its tokenizer (byte-level BPE, 152k vocabulary, the qwen2
// pre-tokenizer) id for id, greedy continuations, and the chat template's
// renderings.  Then the fusor's identities.  Observed on an AVX-512 VNNI
// machine: 2.9e-7 to 3.5e-6 from the reference with exact arithmetic, 0.6e-2
// to 3.6e-2 with int8 activations; 10 of the 15 greedy prompts equal to
// llama.cpp's to the end on every path, the other 5 parting at near-ties
// (our margins at most 0.12).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/blend/fusor.h"
#include "runtime/chat_format.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/integration/llamacpp_golden.h"
#include "tests/integration/reference_logits.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

const std::string kGolden = CB_SOURCE_DIR "/tests/golden/llamacpp_qwen2_0.5b.json";
const std::string kPrompts = CB_SOURCE_DIR "/tests/golden/reference_prompts_qwen2_0.5b.json";
const std::string kReferenceDir = CB_BINARY_DIR "/oracle/qwen2_0.5b/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path + " (scripts/regen_goldens.sh makes it)");
  return nlohmann::json::parse(in);
}

class Qwen2 : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A missing model is a failure, not a skip: scripts/setup.sh fetches it.
    if (!std::filesystem::exists(CB_QWEN05_MODEL)) return;
    model_ = Model::load(CB_QWEN05_MODEL).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(model_, nullptr) << CB_QWEN05_MODEL << " is missing; run scripts/setup.sh model";
  }
  static const Model& model() { return *model_; }
  static Model* model_;
};
Model* Qwen2::model_ = nullptr;

TEST_F(Qwen2, LoadsAsQwen2) {
  const LlamaHparams& hp = model().hparams();
  EXPECT_EQ(hp.arch, Arch::kQwen2);
  EXPECT_EQ(hp.n_layer, 24);
  EXPECT_EQ(hp.n_vocab, 151936);
  EXPECT_EQ(model().chat_format(), ChatFormat::kChatML);
}

TEST_F(Qwen2, TokenizeMatchesLlamaCpp) {
  const nlohmann::json golden = read_json(kGolden);
  ASSERT_GE(golden["tokenize"].size(), 40u);
  for (const auto& c : golden["tokenize"]) {
    const std::string text = c["text"];
    EXPECT_EQ(model().tokenizer().encode(text, c["add_special"], c["parse_special"]),
              c["ids"].get<std::vector<int32_t>>())
        << "text: \"" << text << "\" add_special " << c["add_special"] << " parse_special "
        << c["parse_special"];
  }
}

// The gap between the two largest logits.
double top2_gap(const std::vector<double>& logits) {
  double a = -INFINITY, b = -INFINITY;
  for (double v : logits) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return a - b;
}

// Every reference prompt through a session made with `opts`: within
// `max_rel_l2` of the float64 reference, with its argmax wherever the
// reference's top-2 gap exceeds `min_gap`.
void expect_reference_logits(const Model& model, const SessionOptions& opts, double max_rel_l2,
                             double min_gap = 0.0) {
  const nlohmann::json prompts = read_json(kPrompts);
  ASSERT_GE(prompts["prompts"].size(), 15u);
  for (const auto& p : prompts["prompts"]) {
    const std::string name = p["name"];
    const std::vector<double> ref = test::read_f64(kReferenceDir + name + ".logits.f64");
    ASSERT_EQ(ref.size(), static_cast<size_t>(model.hparams().n_vocab)) << name;
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    Session s(model, opts);
    const test::LogitsError e = test::compare_logits(s.prefill(ids), ref);
    const double gap = top2_gap(ref);
    std::printf("  %-20s %3zu tokens  rel L2 %.2e  top-1 %-9s (reference's top-2 gap %.3f)\n",
                name.c_str(), ids.size(), e.rel_l2, e.same_argmax ? "same" : "DIFFERENT", gap);
    EXPECT_LE(e.rel_l2, max_rel_l2) << name;
    if (gap > min_gap) {
      EXPECT_TRUE(e.same_argmax) << name;
    }
  }
}

// Observed: 2.9e-7 to 3.5e-6 (code_fim), the argmax everywhere.
TEST_F(Qwen2, LastLogitsMatchFloat64Reference) {
  expect_reference_logits(
      model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32},
      1e-3);
}

// The defaults (int8 activations, f16 cache), at the bar
// scripts/regen_goldens.sh holds llama.cpp to; llama.cpp's logits sit
// 0.9e-2 to 3.6e-2 relative L2 from the reference on the 15 golden prompts,
// ours 0.6e-2 to 3.6e-2 on all 21.  The *_at points are where llama.cpp's
// own int8 arithmetic picks the reference's runner-up, near-ties by
// construction (the reference's top-2 gap there is 0.01 to 0.105, on the
// golden prompts 0.70 or more): ours may too, so the argmax is held only
// where the gap exceeds 0.5.
TEST_F(Qwen2, LastLogitsStayCloseWithInt8Activations) {
  expect_reference_logits(model(), {.n_ctx = 512, .n_threads = 2}, 0.2, 0.5);
}

// llama.cpp's continuation parts from the reference's on 5 of the 15
// prompts (the *_at points), each at a near-tie: its margin 0.007 to 0.104,
// the reference's 0.010 to 0.105.  The f32 path parts from llama.cpp at
// exactly those steps, taking the reference's token, with our margins 0.010
// to 0.105 (f32 or f16 cache alike), so a divergence must be a near-tie of
// 0.5 in our logits (about 5x the largest seen; logits here are ~10-20), and
// 8 of the 15 prompts must match llama.cpp over all their tokens (10 do).
TEST_F(Qwen2, GreedyContinuationsMatchLlamaCpp) {
  EXPECT_GE(test::greedy_against_golden(kGolden, CB_QWEN05_MODEL, /*int8_decode=*/false,
                                        {.by_our_logits = true, .near_tie = 0.5}),
            8);
  EXPECT_GE(test::greedy_against_golden(
                kGolden, CB_QWEN05_MODEL, /*int8_decode=*/false,
                {.by_our_logits = true, .near_tie = 0.5, .kv_type = KvType::kF16}),
            8);
}

// Int8 decode parts from llama.cpp at the same 5 steps, our margins 0.004 to
// 0.118; 10 of the 15 prompts match all the way.
TEST_F(Qwen2, GreedyContinuationsMatchLlamaCppWithInt8Decode) {
  EXPECT_GE(test::greedy_against_golden(kGolden, CB_QWEN05_MODEL, /*int8_decode=*/true,
                                        {.by_our_logits = true, .near_tie = 0.5}),
            8);
}

std::vector<ChatMessage> messages_of(const nlohmann::json& c) {
  std::vector<ChatMessage> msgs;
  for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
  return msgs;
}

// llama.cpp recognises the file's template as ChatML by its <|im_start|>
// and renders it with its built-in ChatML (llama_chat_apply_template,
// without --jinja), which writes no default system turn: format_chat
// without one gives the same text, byte for byte.
TEST_F(Qwen2, ChatFormatMatchesLlamaCppsChatML) {
  const nlohmann::json golden = read_json(kGolden);
  ASSERT_FALSE(golden["chat_template"].empty());
  for (const auto& c : golden["chat_template"]) {
    EXPECT_EQ(format_chat(model().chat_format(), messages_of(c), c["add_generation_prompt"]),
              c["llama_chat_apply_template"].get<std::string>())
        << c["name"];
  }
}

// The template itself (Jinja, as llama-cpp-python and llama.cpp's server
// with --jinja render it) opens a conversation that has no system message
// with Qwen's default system turn; the model reads that default from the
// template (Model::chat_default_system), so with it ours is the template's
// text for every conversation.
TEST_F(Qwen2, ChatFormatMatchesTheModelsJinjaTemplate) {
  EXPECT_EQ(model().chat_default_system(),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  const nlohmann::json golden = read_json(kGolden);
  ASSERT_FALSE(golden["chat_template"].empty());
  for (const auto& c : golden["chat_template"]) {
    EXPECT_EQ(format_chat(model().chat_format(), messages_of(c), c["add_generation_prompt"],
                          model().chat_default_system()),
              c["jinja"].get<std::string>())
        << c["name"];
  }
}

// r = 1 is full prefill and r = 0 is reuse on a request of 3 chunks of 120
// tokens.
TEST_F(Qwen2, FusorIdentities) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> word(300, 20000);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = word(rng);
    return v;
  };
  const std::vector<int32_t> head = model().tokenizer().encode(
      "<|im_start|>system\nAnswer from the context.<|im_end|>\n"
      "<|im_start|>user\n",
      true, true);
  const std::vector<int32_t> question = ids(20);
  const std::vector<std::vector<int32_t>> chunks = {ids(120), ids(120), ids(120)};
  const SessionOptions exact = {.n_ctx = 512, .n_threads = 2, .int8_prefill = false};
  Session scratch(model(), exact);
  std::vector<cache::ChunkKV> kv;
  for (const auto& c : chunks) kv.push_back(precompute_chunk_kv(scratch, head, c));
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
  for (const auto& k : kv) sources.push_back(std::make_unique<cache::MemoryChunkSource>(k));
  std::vector<Segment> segs = {{head}};
  for (size_t i = 0; i < chunks.size(); ++i) segs.push_back({chunks[i], sources[i].get(), i == 0});
  segs.push_back({question});
  auto fused = [&](const BlendOptions& o) {
    Session s(model(), exact);
    auto l = fuse_prefill(s, segs, o);
    return std::vector<float>(l.begin(), l.end());
  };
  std::vector<int32_t> all = head;
  for (const auto& c : chunks) all.insert(all.end(), c.begin(), c.end());
  all.insert(all.end(), question.begin(), question.end());
  Session full_session(model(), exact);
  auto full_span = full_session.prefill(all);
  const std::vector<float> full(full_span.begin(), full_span.end());

  BlendOptions all_tokens;
  all_tokens.selection = Selection::kHkvd;
  all_tokens.schedule = {{1, 1.0f}};
  EXPECT_LE(test::rel_l2(fused(all_tokens), full), 1e-4) << "r = 1 is full prefill";
  BlendOptions none = all_tokens;
  none.schedule = {{1, 0.0f}};
  const std::vector<float> reuse = fused({BlendMode::kReuse, {}});
  EXPECT_LE(test::rel_l2(fused(none), reuse), 1e-4) << "r = 0 is reuse";
  EXPECT_GT(test::rel_l2(reuse, full), 1e-3) << "reuse differs from full prefill";
}

}  // namespace
}  // namespace cb
