// Token ids must equal llama.cpp's on the same GGUF: tests/golden/llamacpp.json
// is written by tests/oracle/llamacpp_golden.py (llama-cpp-python).  Its
// "tokenize" section lists {"text", "add_special", "parse_special", "ids"}.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tokenizer/tokenizer_test_util.h"

namespace cb {
namespace {

std::string golden_path() {
  return std::string(CB_SOURCE_DIR) + "/tests/golden/llamacpp.json";
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream out;
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  return out.str();
}

TEST(LlamaCppGolden, TokenizeMatchesExactly) {
  std::ifstream in(golden_path());
  // A missing golden file is a failure, not a skip: without it nothing shows
  // that the ids are the ones the model was trained on.
  ASSERT_TRUE(in.good()) << golden_path()
                         << " is missing; generate it with scripts/regen_goldens.sh";
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_TRUE(golden.contains("tokenize")) << "no \"tokenize\" section in " << golden_path();
  const auto& cases = golden["tokenize"];
  ASSERT_FALSE(cases.empty());

  const Tokenizer& t = test::model_tokenizer();
  int mismatches = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const bool add_special = c.at("add_special").get<bool>();
    const bool parse_special = c.at("parse_special").get<bool>();
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> got = t.encode(text, add_special, parse_special);
    if (got != expected) ++mismatches;
    EXPECT_EQ(show(got), show(expected)) << "text: \"" << text << "\" add_special=" << add_special
                                         << " parse_special=" << parse_special;
  }
  std::printf("[ info ] %zu llama.cpp tokenize cases, %d mismatches\n", cases.size(), mismatches);
}

}  // namespace
}  // namespace cb
