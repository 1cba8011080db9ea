#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "platform/error.h"
#include "runtime/gguf/gguf_file.h"
#include "tests/runtime/gguf_builder.h"

namespace cb {
namespace {

using test::GgufBuilder;

std::vector<uint8_t> f32_bytes(size_t n, float v = 1.0f) {
  std::vector<uint8_t> b(n * 4);
  for (size_t i = 0; i < n; ++i) std::memcpy(&b[i * 4], &v, 4);
  return b;
}

std::vector<uint8_t> small_file() {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.kv_f32("llama.rope.freq_base", 10000.0f);
  b.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  b.tensor("w", 0, {4, 2}, f32_bytes(8, 0.5f));
  b.tensor("n", 0, {4}, f32_bytes(4));
  return b.bytes();
}

ErrorCode code_of(const std::vector<uint8_t>& bytes) {
  try {
    GgufFile::parse(bytes.data(), bytes.size());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()), "");
    return e.code();
  }
  return ErrorCode::kInternal;  // parsed fine
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(&b[off], &v, sizeof v);
}

TEST(Gguf, ParsesValidFile) {
  auto bytes = small_file();
  GgufFile f = GgufFile::parse(bytes.data(), bytes.size());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(*f.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensor* w = f.find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(w->n_bytes, 32u);
  EXPECT_FLOAT_EQ(static_cast<const float*>(w->data)[7], 0.5f);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  EXPECT_FALSE(f.get_int("absent").has_value());
  EXPECT_THROW(f.get_int("general.architecture"), Error);  // wrong type
}

TEST(Gguf, EveryTruncationIsAFormatError) {
  auto bytes = small_file();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ErrorCode c = code_of(cut);
    EXPECT_EQ(c, ErrorCode::kFormat) << "prefix of " << n << " bytes";
  }
}

TEST(Gguf, WrongMagicAndVersion) {
  auto bytes = small_file();
  bytes[0] = 'X';
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
  bytes = small_file();
  poke<uint32_t>(bytes, 4, 1);
  EXPECT_EQ(code_of(bytes), ErrorCode::kUnsupported);
  poke<uint32_t>(bytes, 4, 2);  // v2 has the same layout as v3
  EXPECT_EQ(code_of(bytes), ErrorCode::kInternal);
}

TEST(Gguf, AbsurdCountsAreRejectedWithoutAllocating) {
  auto bytes = small_file();
  poke<uint64_t>(bytes, 8, uint64_t{1} << 60);  // tensor count
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
  bytes = small_file();
  poke<uint64_t>(bytes, 16, ~uint64_t{0});  // metadata count
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
  bytes = small_file();
  poke<uint64_t>(bytes, 24, uint64_t{1} << 62);  // first key's length
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
}

TEST(Gguf, BadTensorInfo) {
  auto dims = [](std::vector<uint64_t> d, uint32_t type, size_t data_bytes) {
    GgufBuilder b;
    b.tensor("t", type, d, std::vector<uint8_t>(data_bytes));
    return b.bytes();
  };
  EXPECT_EQ(code_of(dims({4, 0}, 0, 0)), ErrorCode::kFormat);  // zero dim
  EXPECT_EQ(code_of(dims({1u << 31, 1u << 31, 1u << 31}, 0, 0)),
            ErrorCode::kFormat);                                         // overflow / too big
  EXPECT_EQ(code_of(dims({4, 1, 1, 1, 1}, 0, 16)), ErrorCode::kFormat);  // 5 dims
  EXPECT_EQ(code_of(dims({4}, 77, 16)), ErrorCode::kUnsupported);        // unknown type
  EXPECT_EQ(code_of(dims({33}, 2, 18 * 2)), ErrorCode::kFormat);         // not a block multiple
  EXPECT_EQ(code_of(dims({64}, 0, 16)), ErrorCode::kFormat);             // data past the end
}

// A type ggml has and this runtime does not decode is named in the error.
TEST(Gguf, UnsupportedTypeIsNamed) {
  GgufBuilder b;
  b.tensor("blk.0.ffn_down.weight", 21, {256}, std::vector<uint8_t>(110));  // IQ3_S
  const auto bytes = b.bytes();
  try {
    GgufFile::parse(bytes.data(), bytes.size());
    FAIL() << "an IQ3_S tensor must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("IQ3_S (21)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
  }
}

TEST(Gguf, TensorOffsetOutsideFile) {
  GgufBuilder b;
  b.tensor("t", 0, {4}, f32_bytes(4));
  auto bytes = b.bytes();
  // The offset field is the last 8 bytes of the tensor info, just before the
  // padding that precedes the data section (data is 16 bytes, aligned to 32).
  size_t info_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
  poke<uint64_t>(bytes, info_end - 8, 1u << 20);
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
  poke<uint64_t>(bytes, info_end - 8, 3);  // misaligned
  EXPECT_EQ(code_of(bytes), ErrorCode::kFormat);
}

TEST(Gguf, DuplicateNames) {
  GgufBuilder b;
  b.kv_u32("k", 1);
  b.kv_u32("k", 2);
  EXPECT_EQ(code_of(b.bytes()), ErrorCode::kFormat);
  GgufBuilder t;
  t.tensor("x", 0, {4}, f32_bytes(4));
  t.tensor("x", 0, {4}, f32_bytes(4));
  EXPECT_EQ(code_of(t.bytes()), ErrorCode::kFormat);
}

TEST(Gguf, MissingFileIsAnIoError) {
  try {
    GgufFile::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

// A FIFO (or any other non-regular file) is refused at once; opening it
// must not wait for a writer.  The child process bounds the wait.
TEST(Gguf, FifoIsAnIoErrorWithoutBlocking) {
  char dir[] = "/tmp/cb_gguf_fifo_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/model.gguf";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);
    try {
      GgufFile::open(fifo);
      _exit(1);
    } catch (const Error& e) {
      const bool named = std::string(e.what()).find("not a regular file") != std::string::npos;
      _exit(e.code() == ErrorCode::kIo && named ? 0 : 2);
    } catch (...) {
      _exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  unlink(fifo.c_str());
  rmdir(dir);
  ASSERT_TRUE(WIFEXITED(status)) << "blocked or crashed: signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Gguf, OpensTheRealModel) {
  const char* env = std::getenv("CB_MODEL");
  GgufFile f = GgufFile::open(env ? env : CB_DEFAULT_MODEL);
  EXPECT_GE(f.version(), 2u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  ASSERT_TRUE(f.get_int("llama.block_count").has_value());
  EXPECT_EQ(f.tensors().size(), static_cast<size_t>(2 + 9 * *f.get_int("llama.block_count")));
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_GE(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(f.base()));
    EXPECT_LE(static_cast<const uint8_t*>(t.data) + t.n_bytes,
              static_cast<const uint8_t*>(f.base()) + f.size());
  }
}

}  // namespace
}  // namespace cb
