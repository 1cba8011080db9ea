// Generation and the state a conversation carries between calls: the
// pending token, the kept logits, stop strings, cancellation, and errors
// that change nothing.
#include "runtime/generator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "platform/error.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

struct Generated {
  GenerationStats stats;
  std::vector<int32_t> tokens;
  std::string text;
};

class GeneratorTest : public testing::Test {
 protected:
  std::vector<int32_t> tok(const std::string& s) {
    return test::shared_model().tokenizer().encode(s, true, true);
  }
  // Greedy generation of at most `max_tokens`; the sink stops after
  // `stop_after` tokens when given.
  Generated run(Generator& g, const std::vector<int32_t>& prompt, int32_t max_tokens,
                std::vector<std::string> stops = {}, int stop_after = -1) {
    Sampler sampler({});
    const StopStrings stop_strings(std::move(stops));
    Generated r;
    r.stats = g.generate(
        prompt, {.max_tokens = max_tokens}, sampler, stop_strings,
        [&](int32_t t, const std::string& piece) {
          r.tokens.push_back(t);
          r.text += piece;
          return stop_after < 0 || static_cast<int>(r.tokens.size()) < stop_after;
        },
        std::chrono::steady_clock::now());
    return r;
  }

  // An f32 cache: continuing feeds the pending token by another path than
  // one long call does (~1e-7 apart), and f16 rounding of the cache can turn
  // that into a flipped near-tie over six tokens.
  Session session{test::shared_model(), {.n_ctx = 128, .n_threads = 2, .kv_type = KvType::kF32}};
  Generator gen{session};
};

// Three tokens, then three more from the empty prompt: the same six tokens
// as one call of six, the last token of the first call fed with the second.
TEST_F(GeneratorTest, ContinuingEqualsOneLongerCall) {
  const std::vector<int32_t> prompt = tok("The capital of France is");
  const Generated whole = run(gen, prompt, 6);
  ASSERT_EQ(whole.tokens.size(), 6u);
  EXPECT_EQ(whole.stats.stop, StopReason::kMaxTokens);
  EXPECT_NE(whole.text.find("Paris"), std::string::npos) << whole.text;

  gen.reset();
  const Generated first = run(gen, prompt, 3);
  EXPECT_EQ(gen.n_past(), static_cast<int64_t>(prompt.size()) + 3);  // the last one pending
  EXPECT_TRUE(gen.logits().empty());
  const Generated second = run(gen, {}, 3);
  std::vector<int32_t> joined = first.tokens;
  joined.insert(joined.end(), second.tokens.begin(), second.tokens.end());
  EXPECT_EQ(joined, whole.tokens);
}

TEST_F(GeneratorTest, StopStringEndsTheTextBeforeIt) {
  const Generated r = run(gen, tok("The capital of France is"), 16, {"Paris"});
  EXPECT_EQ(r.stats.stop, StopReason::kStopString);
  EXPECT_EQ(r.text.find("Paris"), std::string::npos) << r.text;
}

TEST_F(GeneratorTest, SinkStopsGeneration) {
  const Generated r = run(gen, tok("The capital of France is"), 16, {}, 2);
  EXPECT_EQ(r.stats.stop, StopReason::kCancelled);
  EXPECT_FALSE(r.stats.aborted);
  EXPECT_EQ(r.stats.n_generated, 2);
}

TEST_F(GeneratorTest, ErrorsChangeNothing) {
  try {
    run(gen, {}, 4);
    FAIL() << "an empty prompt on an empty session";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  const std::vector<int32_t> prompt = tok("Hello");
  gen.prefill(prompt);
  const std::vector<float> kept(gen.logits().begin(), gen.logits().end());
  const std::vector<int32_t> too_long(200, prompt.back());
  try {
    gen.prefill(too_long);
    FAIL() << "200 tokens in a context of 128";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kContextOverflow);
  }
  EXPECT_EQ(gen.n_past(), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(std::vector<float>(gen.logits().begin(), gen.logits().end()), kept);
}

}  // namespace
}  // namespace cb
