// read_tokenizer_vocab on small GGUF files written in memory: defaults,
// end-of-turn detection, and cb::Error (never a crash) for bad metadata.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "platform/error.h"
#include "tests/tokenizer/tokenizer_test_util.h"

namespace cb {
namespace {

using test::GgufWriter;

TokenizerVocab read(const GgufWriter& w) {
  const std::vector<uint8_t> bytes = w.bytes();
  const GgufFile file = GgufFile::parse(bytes.data(), bytes.size());
  return read_tokenizer_vocab(file);
}

// A valid ChatML-style byte-level vocabulary without an EOT id.
struct Gpt2File {
  std::string model = "gpt2";
  std::string pre = "smollm";
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab"};
  std::vector<int32_t> types = {3, 3, 3, 1, 1, 1};
  std::vector<std::string> merges = {"a b"};
  std::function<void(GgufWriter&)> extra;

  GgufWriter writer() const {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    if (!model.empty()) w.add_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
    if (!tokens.empty()) w.add_strings("tokenizer.ggml.tokens", tokens);
    if (!types.empty()) w.add_i32s("tokenizer.ggml.token_type", types);
    if (!merges.empty()) w.add_strings("tokenizer.ggml.merges", merges);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 0);
    if (extra) extra(w);
    return w;
  }
};

void expect_error(const Gpt2File& f, ErrorCode code, const std::string& mention) {
  try {
    const TokenizerVocab v = read(f.writer());
    Tokenizer t(v);
    ADD_FAILURE() << "accepted; expected an error mentioning " << mention;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(VocabGguf, ReadsFieldsAndFindsChatMlEndOfTurn) {
  const TokenizerVocab v = read(Gpt2File{}.writer());
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "smollm");
  EXPECT_EQ(v.tokens.size(), 6u);
  EXPECT_EQ(v.token_types, (std::vector<int32_t>{3, 3, 3, 1, 1, 1}));
  EXPECT_EQ(v.merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 0);
  EXPECT_EQ(v.eot_id, 2) << "<|im_end|> is preferred over <|endoftext|>";
  EXPECT_EQ(v.unk_id, -1);
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_FALSE(v.add_space_prefix.has_value());

  const Tokenizer t(v);
  EXPECT_TRUE(t.is_end_of_generation(0));
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_EQ(t.encode("<|im_start|>ab<|im_end|>", false, true), (std::vector<int32_t>{1, 5, 2}));
}

TEST(VocabGguf, ExplicitKeysWinOverDefaults) {
  Gpt2File f;
  f.pre = "llama-bpe";
  EXPECT_TRUE(read(f.writer()).add_bos) << "llama.cpp adds BOS for Llama 3 by default";
  f.extra = [](GgufWriter& w) {
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    w.add_bool("tokenizer.ggml.add_eos_token", true);
    w.add_u32("tokenizer.ggml.eot_token_id", 0);
    w.add_u32("tokenizer.ggml.unknown_token_id", 3);
    w.add_u32("tokenizer.ggml.padding_token_id", 4);
  };
  const TokenizerVocab v = read(f.writer());
  EXPECT_FALSE(v.add_bos);
  EXPECT_TRUE(v.add_eos);
  EXPECT_EQ(v.eot_id, 0);
  EXPECT_EQ(v.unk_id, 3);
  EXPECT_EQ(v.pad_id, 4);
}

TEST(VocabGguf, SentencePieceDefaults) {
  Gpt2File f;
  f.model = "llama";
  f.pre = "";
  f.merges.clear();
  f.extra = [](GgufWriter& w) { w.add_floats("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3}); };
  const TokenizerVocab v = read(f.writer());
  EXPECT_TRUE(v.add_bos);
  ASSERT_TRUE(v.add_space_prefix.has_value());
  EXPECT_TRUE(*v.add_space_prefix);
  EXPECT_EQ(v.scores.size(), 6u);
}

TEST(VocabGguf, MissingOrInconsistentMetadataIsAnError) {
  Gpt2File f;
  f.tokens.clear();
  expect_error(f, ErrorCode::kFormat, "tokenizer.ggml.tokens");

  f = Gpt2File{};
  f.model.clear();
  expect_error(f, ErrorCode::kFormat, "tokenizer.ggml.model");

  f = Gpt2File{};
  f.model = "bert";
  expect_error(f, ErrorCode::kUnsupported, "bert");

  f = Gpt2File{};
  f.pre = "unheard-of";
  expect_error(f, ErrorCode::kUnsupported, "unheard-of");

  f = Gpt2File{};
  f.types.pop_back();
  expect_error(f, ErrorCode::kFormat, "token_type");

  f = Gpt2File{};
  f.types[4] = 9;
  expect_error(f, ErrorCode::kFormat, "token_type");

  f = Gpt2File{};
  f.merges.clear();
  expect_error(f, ErrorCode::kFormat, "merges");

  f = Gpt2File{};
  f.merges = {"a c"};
  expect_error(f, ErrorCode::kFormat, "merge");

  f = Gpt2File{};
  f.tokens[4] = "a";
  expect_error(f, ErrorCode::kFormat, "same text");

  f = Gpt2File{};
  f.extra = [](GgufWriter& w) { w.add_u32("tokenizer.ggml.unknown_token_id", 6); };
  expect_error(f, ErrorCode::kFormat, "unknown_token_id");

  f = Gpt2File{};
  f.extra = [](GgufWriter& w) { w.add_floats("tokenizer.ggml.scores", {1, 2}); };
  expect_error(f, ErrorCode::kFormat, "scores");

  f = Gpt2File{};
  f.extra = [](GgufWriter& w) { w.add_string("tokenizer.ggml.add_bos_token", "yes"); };
  expect_error(f, ErrorCode::kFormat, "add_bos_token");
}

TEST(VocabGguf, TruncatedFilesNeverCrash) {
  const std::vector<uint8_t> bytes = Gpt2File{}.writer().bytes();
  // Every prefix either parses to a consistent vocabulary or throws cb::Error.
  size_t errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
    try {
      const GgufFile file = GgufFile::parse(prefix.data(), prefix.size());
      Tokenizer t(read_tokenizer_vocab(file));
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, bytes.size() / 2);
}

}  // namespace
}  // namespace cb
