// libFuzzer target: arbitrary bytes through the real model's tokenizer.
// Checks, for both parse_special settings, that encoding never fails, every
// id is in the vocabulary, and decoding gives the input back (minus the
// bytes the vocabulary cannot spell at all, which encode drops).
//
//   build-fuzz/bin/fuzz_tokenizer -max_total_time=60    (CB_MODEL overrides the model)
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/gguf/gguf_file.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/vocab_gguf.h"

#ifndef CB_DEFAULT_MODEL
#define CB_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

namespace {

struct Fixture {
  cb::Tokenizer tokenizer;
  std::array<bool, 256> spellable{};  // bytes the vocabulary has a token for

  static Fixture load() {
    const char* env = std::getenv("CB_MODEL");
    const std::string path = env && *env ? env : CB_DEFAULT_MODEL;
    const cb::GgufFile file = cb::GgufFile::open(path);
    Fixture f{cb::Tokenizer(cb::read_tokenizer_vocab(file)), {}};
    for (int b = 0; b < 256; ++b) {
      const std::string one(1, static_cast<char>(b));
      f.spellable[b] = f.tokenizer.decode(f.tokenizer.encode(one, false, false)) == one;
    }
    return f;
  }
};

const Fixture& fixture() {
  static const Fixture f = Fixture::load();
  return f;
}

void check(bool ok, const char* what, std::string_view input) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_tokenizer: %s (input of %zu bytes)\n", what, input.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = fixture();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string expected;
  expected.reserve(size);
  for (const char c : input) {
    if (f.spellable[static_cast<uint8_t>(c)]) expected.push_back(c);
  }

  for (const bool parse_special : {false, true}) {
    const std::vector<int32_t> ids =
        f.tokenizer.encode(input, /*add_special=*/false, parse_special);
    for (const int32_t id : ids)
      check(id >= 0 && id < f.tokenizer.n_vocab(), "id out of range", input);
    // Special tokens found in the text render back as their text.
    check(f.tokenizer.decode(ids, /*render_special=*/parse_special) == expected,
          parse_special ? "decode(encode(parse_special)) differs" : "decode(encode) differs",
          input);
  }
  // Adding BOS/EOS must keep the rest unchanged.
  const std::vector<int32_t> with_special = f.tokenizer.encode(input, true, true);
  check(f.tokenizer.decode(with_special, true).find(expected) != std::string::npos,
        "add_special changed the text", input);
  return 0;
}
