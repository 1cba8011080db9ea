#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "platform/error.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/runtime/gguf_builder.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

using test::rel_l2;

std::vector<int32_t> prompt_ids() {
  return model().tokenizer().encode(
      "The quick brown fox jumps over the lazy dog. It was a sunny day", false, false);
}

TEST(Model, HyperParametersComeFromTheFile) {
  const LlamaHparams& hp = model().hparams();
  const GgufFile& f = model().gguf();
  EXPECT_EQ(hp.n_layer, *f.get_int("llama.block_count"));
  EXPECT_EQ(hp.n_embd, *f.get_int("llama.embedding_length"));
  EXPECT_EQ(hp.n_head_kv, *f.get_int("llama.attention.head_count_kv"));
  EXPECT_EQ(static_cast<int64_t>(model().layers().size()), hp.n_layer);
  EXPECT_EQ(model().fingerprint().size(), 32u);
  EXPECT_EQ(model().fingerprint(), model().fingerprint());
}

TEST(Session, BatchedPrefillEqualsTokenByToken) {
  auto ids = prompt_ids();
  ASSERT_GT(ids.size(), 8u);
  Session whole(model(), {.n_ctx = 256, .n_threads = 2});
  auto a = whole.prefill(ids);
  std::vector<float> logits_whole(a.begin(), a.end());

  SessionOptions chunked{.n_ctx = 256, .n_threads = 2, .n_batch = 5};
  Session pieces(model(), chunked);
  auto b = pieces.prefill(ids);
  EXPECT_LT(rel_l2(b, logits_whole), 1e-5);

  Session steps(model(), {.n_ctx = 256, .n_threads = 1});
  std::span<const float> c;
  for (int32_t t : ids) c = steps.decode(t);
  EXPECT_LT(rel_l2(c, logits_whole), 1e-5);
  EXPECT_EQ(steps.n_past(), static_cast<int64_t>(ids.size()));
}

TEST(Session, ScalarAndFastKernelsAgree) {
  auto ids = prompt_ids();
  Session fast(model(), {.n_ctx = 128, .n_threads = 2});
  auto a = fast.prefill(ids);
  std::vector<float> la(a.begin(), a.end());
  Session ref(model(), {.n_ctx = 128, .n_threads = 2, .kernels = CpuKernelLevel::kScalar});
  EXPECT_LT(rel_l2(ref.prefill(ids), la), 1e-4);
}

TEST(Session, TruncateThenReplayGivesSameLogits) {
  auto ids = prompt_ids();
  Session s(model(), {.n_ctx = 128, .n_threads = 2});
  auto full = s.prefill(ids);
  std::vector<float> expect(full.begin(), full.end());
  s.truncate(3);
  auto again = s.prefill(std::span(ids).subspan(3));
  EXPECT_LT(rel_l2(again, expect), 1e-5);
}

TEST(Session, ContextOverflowIsAClearErrorAndChangesNothing) {
  auto ids = prompt_ids();
  Session s(model(), {.n_ctx = 16, .n_threads = 1});
  s.prefill(std::span(ids).first(10));
  try {
    s.prefill(std::span(ids).subspan(0, 7));
    FAIL() << "expected an overflow";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kContextOverflow);
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos);
  }
  EXPECT_EQ(s.n_past(), 10);
  EXPECT_NO_THROW(s.prefill(std::span(ids).subspan(0, 6)));
}

TEST(Session, BadArguments) {
  EXPECT_THROW(Session(model(), {.n_ctx = model().hparams().n_ctx_train + 1}), Error);
  Session s(model(), {.n_ctx = 32, .n_threads = 1});
  std::vector<int32_t> bad = {static_cast<int32_t>(model().hparams().n_vocab)};
  EXPECT_THROW(s.prefill(bad), Error);
  EXPECT_THROW(s.prefill({}), Error);
  EXPECT_THROW(s.truncate(1), Error);
  EXPECT_EQ(s.n_past(), 0);
}

// Valid GGUF files that are not usable Llama models: the loader says why.
TEST(Model, RejectsFilesThatAreNotLlamaModels) {
  auto expect_error = [](test::GgufBuilder& b, ErrorCode code, const std::string& needle) {
    std::string path = testing::TempDir() + "/not_a_model.gguf";
    auto bytes = b.bytes();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    try {
      Model::load(path);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  test::GgufBuilder other;
  other.kv_str("general.architecture", "mamba");
  expect_error(other, ErrorCode::kUnsupported, "mamba");
  test::GgufBuilder no_layers;
  no_layers.kv_str("general.architecture", "llama");
  expect_error(no_layers, ErrorCode::kFormat, "llama.block_count");
  test::GgufBuilder no_tensors;
  no_tensors.kv_str("general.architecture", "llama");
  for (const char* k : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                        "llama.attention.head_count", "llama.context_length"})
    no_tensors.kv_u32(k, std::string(k) == "llama.attention.head_count" ? 2 : 8);
  expect_error(no_tensors, ErrorCode::kFormat, "token_embd.weight");
}

}  // namespace
}  // namespace cb
