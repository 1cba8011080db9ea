// The real Gemma 3 270M (Q4_K_M, fetched by scripts/setup.sh) against its
// oracles.  The float64 reference (CTest oracle_gemma3_reference) on the
// golden prompts and at every point where llama.cpp's greedy continuation
// parts from the reference's (tests/oracle/reference_divergences.py): last-
// position logits within 1e-3 relative L2, the same argmax.
// llama.cpp on the same file (tests/golden/llamacpp_gemma3.json, written by
// tests/oracle/llamacpp_golden.py --chat gemma): its tokenizer (SentencePiece
// with a 262k vocabulary) id for id, and greedy continuations.  llama.cpp
// rounds Gemma's GELU inputs to f16 besides its f16 KV cache and 8-bit
// activations, and its logits sit up to ~0.65 from the reference's where
// the two part, so a divergence must be a near-tie of 1.0 in our logits,
// and 5 of the 14 prompts must match llama.cpp over all 32 tokens (6 do;
// 7 with int8 decode).  Then the fusor's
// identities on requests longer than the 512-key sliding window, where local
// layers must attend within the window in every pass.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
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

const std::string kGolden = CB_SOURCE_DIR "/tests/golden/llamacpp_gemma3.json";

class Gemma3 : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A missing model is a failure, not a skip: scripts/setup.sh fetches it.
    if (!std::filesystem::exists(CB_GEMMA3_MODEL)) return;
    model_ = Model::load(CB_GEMMA3_MODEL).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(model_, nullptr) << CB_GEMMA3_MODEL << " is missing; run scripts/setup.sh model";
  }
  static const Model& model() { return *model_; }
  static Model* model_;
};
Model* Gemma3::model_ = nullptr;

TEST_F(Gemma3, LoadsAsGemma3WithLocalLayers) {
  const LlamaHparams& hp = model().hparams();
  EXPECT_EQ(hp.arch, Arch::kGemma3);
  EXPECT_EQ(hp.sliding_window, 512);
  EXPECT_TRUE(hp.is_local(0));
  EXPECT_FALSE(hp.is_local(5));  // every sixth layer is global
  EXPECT_EQ(hp.attention_window(5), 0);
  EXPECT_EQ(hp.rope_base(0), 10000.0f);
  EXPECT_EQ(hp.rope_base(5), 1000000.0f);
  // The file has no chat template: the format comes from its control tokens.
  EXPECT_EQ(model().chat_format(), ChatFormat::kGemma);
}

TEST_F(Gemma3, TokenizeMatchesLlamaCpp) {
  std::ifstream in(kGolden);
  ASSERT_TRUE(in) << kGolden << " is missing";
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_FALSE(golden["tokenize"].empty());
  for (const auto& c : golden["tokenize"]) {
    const std::string text = c["text"];
    EXPECT_EQ(model().tokenizer().encode(text, c["add_special"], c["parse_special"]),
              c["ids"].get<std::vector<int32_t>>())
        << "text: \"" << text << "\"";
  }
}

TEST_F(Gemma3, LastLogitsMatchFloat64Reference) {
  std::ifstream in(CB_SOURCE_DIR "/tests/golden/reference_prompts_gemma3.json");
  ASSERT_TRUE(in);
  const nlohmann::json prompts = nlohmann::json::parse(in);
  ASSERT_GE(prompts["prompts"].size(), 14u);
  for (const auto& p : prompts["prompts"]) {
    const std::string name = p["name"];
    const std::vector<double> ref =
        test::read_f64(CB_BINARY_DIR "/oracle/gemma3/" + name + ".logits.f64");
    ASSERT_EQ(ref.size(), static_cast<size_t>(model().hparams().n_vocab)) << name;
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    Session s(model(),
              {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
    const test::LogitsError e = test::compare_logits(s.prefill(ids), ref);
    std::printf("  %-20s %3zu tokens  rel L2 %.2e\n", name.c_str(), ids.size(), e.rel_l2);
    EXPECT_LE(e.rel_l2, 1e-3) << name;
    EXPECT_TRUE(e.same_argmax) << name;
  }
}

TEST_F(Gemma3, GreedyContinuationsMatchLlamaCpp) {
  EXPECT_GE(test::greedy_against_golden(kGolden, CB_GEMMA3_MODEL, /*int8_decode=*/false,
                                        {.by_our_logits = true, .near_tie = 1.0}),
            5);
  EXPECT_GE(test::greedy_against_golden(
                kGolden, CB_GEMMA3_MODEL, /*int8_decode=*/false,
                {.by_our_logits = true, .near_tie = 1.0, .kv_type = KvType::kF16}),
            5);
}

// The int8 decode path moves Gemma's logits (magnitudes ~20) by up to ~0.4
// more, so its near-tie bound is wider.
TEST_F(Gemma3, GreedyContinuationsMatchLlamaCppWithInt8Decode) {
  EXPECT_GE(test::greedy_against_golden(kGolden, CB_GEMMA3_MODEL, /*int8_decode=*/true,
                                        {.by_our_logits = true, .near_tie = 1.5}),
            5);
}

// r = 1 is full prefill and r = 0 is reuse on a request of 3 chunks of 250
// tokens: the last chunk's and the question's queries reach past the window.
TEST_F(Gemma3, FusorIdentitiesBeyondTheSlidingWindow) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> word(300, 20000);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = word(rng);
    return v;
  };
  const std::vector<int32_t> head = model().tokenizer().encode("<start_of_turn>user\n", true, true);
  const std::vector<int32_t> question = ids(20);
  const std::vector<std::vector<int32_t>> chunks = {ids(250), ids(250), ids(250)};
  Session scratch(model(), {.n_ctx = 1024, .n_threads = 2, .int8_prefill = false});
  std::vector<cache::ChunkKV> kv;
  for (const auto& c : chunks) kv.push_back(precompute_chunk_kv(scratch, head, c));
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
  for (const auto& k : kv) sources.push_back(std::make_unique<cache::MemoryChunkSource>(k));
  std::vector<Segment> segs = {{head}};
  for (size_t i = 0; i < chunks.size(); ++i) segs.push_back({chunks[i], sources[i].get(), i == 0});
  segs.push_back({question});
  auto fused = [&](const BlendOptions& o) {
    Session s(model(), {.n_ctx = 1024, .n_threads = 2, .int8_prefill = false});
    auto l = fuse_prefill(s, segs, o);
    return std::vector<float>(l.begin(), l.end());
  };
  std::vector<int32_t> all = head;
  for (const auto& c : chunks) all.insert(all.end(), c.begin(), c.end());
  all.insert(all.end(), question.begin(), question.end());
  Session full_session(model(), {.n_ctx = 1024, .n_threads = 2, .int8_prefill = false});
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
