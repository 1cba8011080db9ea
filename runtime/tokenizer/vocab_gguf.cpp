#include "runtime/tokenizer/vocab_gguf.h"

#include <limits>
#include <string>

#include "platform/error.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/special_tokens.h"

namespace cb {
namespace {

int32_t read_token_id(const GgufFile& file, const std::string& key, size_t n_tokens) {
  const std::optional<int64_t> id = file.get_int(key);
  if (!id) return -1;
  if (*id < 0 || static_cast<uint64_t>(*id) >= n_tokens) {
    fail(ErrorCode::kFormat, "GGUF " + key + " = " + std::to_string(*id) +
                                 " is outside the vocabulary of " + std::to_string(n_tokens) +
                                 " tokens");
  }
  return static_cast<int32_t>(*id);
}

}  // namespace

TokenizerVocab read_tokenizer_vocab(const GgufFile& file) {
  TokenizerVocab v;
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) fail(ErrorCode::kFormat, "GGUF has no tokenizer.ggml.model");
  if (*model != "gpt2" && *model != "llama") {
    fail(ErrorCode::kUnsupported, "unsupported tokenizer.ggml.model '" + *model + "'");
  }
  v.model = *model;
  v.pre = file.get_string("tokenizer.ggml.pre").value_or("");

  v.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (v.tokens.empty()) fail(ErrorCode::kFormat, "GGUF has no tokenizer.ggml.tokens");
  if (v.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(ErrorCode::kFormat, "GGUF tokenizer.ggml.tokens is too long");
  }
  const size_t n = v.tokens.size();
  const auto check_size = [&](size_t size, const char* key) {
    if (size != 0 && size != n) {
      fail(ErrorCode::kFormat, std::string("GGUF ") + key + " has " + std::to_string(size) +
                                   " entries for " + std::to_string(n) + " tokens");
    }
  };
  v.scores = file.get_float_array("tokenizer.ggml.scores");
  check_size(v.scores.size(), "tokenizer.ggml.scores");
  const std::vector<int64_t> types = file.get_int_array("tokenizer.ggml.token_type");
  check_size(types.size(), "tokenizer.ggml.token_type");
  v.token_types.reserve(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte)) {
      fail(ErrorCode::kFormat, "GGUF tokenizer.ggml.token_type[" + std::to_string(i) +
                                   "] = " + std::to_string(types[i]) + " is not a token type");
    }
    v.token_types.push_back(static_cast<int32_t>(types[i]));
  }
  v.merges = file.get_string_array("tokenizer.ggml.merges");
  if (v.model == "gpt2" && v.merges.empty()) {
    fail(ErrorCode::kFormat, "GGUF gpt2 tokenizer has no tokenizer.ggml.merges");
  }
  if (v.model == "llama" && v.scores.empty()) {
    fail(ErrorCode::kFormat, "GGUF llama tokenizer has no tokenizer.ggml.scores");
  }

  v.bos_id = read_token_id(file, "tokenizer.ggml.bos_token_id", n);
  v.eos_id = read_token_id(file, "tokenizer.ggml.eos_token_id", n);
  v.eot_id = read_token_id(file, "tokenizer.ggml.eot_token_id", n);
  v.eom_id = read_token_id(file, "tokenizer.ggml.eom_token_id", n);
  v.unk_id = read_token_id(file, "tokenizer.ggml.unknown_token_id", n);
  v.pad_id = read_token_id(file, "tokenizer.ggml.padding_token_id", n);
  if (v.eot_id < 0) v.eot_id = tok::find_eot_by_text(v.tokens);

  // llama.cpp's defaults when the file does not say.
  bool add_bos_default = v.model == "llama";
  if (v.model == "gpt2") add_bos_default = tok::pre_tokenizer_spec(v.pre).add_bos_default;
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  if (!v.add_space_prefix && v.model == "llama") v.add_space_prefix = true;
  return v;
}

}  // namespace cb
