// cb::dequantize_row against the gguf Python package.  The golden file is
// written by tests/oracle/quant_vectors.py (see its docstring to regenerate).
// The match must be bit-exact: the C++ code performs the same f32 operations
// in the same order as gguf/ggml.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/dequantize.h"
#include "platform/error.h"

namespace cb {
namespace {

struct Entry {
  uint32_t type = 0;
  std::vector<uint8_t> raw;
  std::vector<float> expected;
};

uint32_t read_u32(const std::vector<uint8_t>& buf, size_t* pos) {
  if (*pos + 4 > buf.size()) throw std::runtime_error("golden file truncated");
  uint32_t v;
  std::memcpy(&v, buf.data() + *pos, 4);
  *pos += 4;
  return v;
}

std::vector<Entry> load_golden() {
  const std::string path = std::string(CB_SOURCE_DIR) + "/tests/golden/quant_vectors.bin";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
  if (buf.size() < 12 || std::memcmp(buf.data(), "CBQV0001", 8) != 0) {
    throw std::runtime_error("bad golden file header");
  }
  size_t pos = 8;
  const uint32_t count = read_u32(buf, &pos);
  std::vector<Entry> entries(count);
  for (Entry& e : entries) {
    e.type = read_u32(buf, &pos);
    const uint32_t n_elems = read_u32(buf, &pos);
    const uint32_t n_bytes = read_u32(buf, &pos);
    if (pos + n_bytes + 4ull * n_elems > buf.size()) throw std::runtime_error("golden truncated");
    e.raw.assign(buf.begin() + pos, buf.begin() + pos + n_bytes);
    pos += n_bytes;
    e.expected.resize(n_elems);
    std::memcpy(e.expected.data(), buf.data() + pos, 4ull * n_elems);
    pos += 4ull * n_elems;
  }
  return entries;
}

TEST(DequantizeOracle, BitExactAgainstGgufPackage) {
  const std::vector<Entry> entries = load_golden();
  std::set<uint32_t> seen;
  for (const Entry& e : entries) {
    ASSERT_TRUE(dtype_supported(e.type)) << e.type;
    const DType t = static_cast<DType>(e.type);
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = static_cast<int64_t>(e.expected.size());
    ASSERT_EQ(dtype_row_bytes(t, n), e.raw.size());
    // The raw bytes are copied to an aligned buffer, as GGUF data would be.
    std::vector<uint64_t> aligned((e.raw.size() + 7) / 8);
    std::memcpy(aligned.data(), e.raw.data(), e.raw.size());
    std::vector<float> got(e.expected.size(), -1.0f);
    dequantize_row(t, aligned.data(), got.data(), n);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &e.expected[i], 4);
      if (a != b && ++mismatches <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << got[i] << " expected " << e.expected[i];
      }
    }
    EXPECT_EQ(mismatches, 0);
    seen.insert(e.type);
  }
  // Every supported type is covered.
  EXPECT_EQ(seen.size(), std::size(test::kAllTypes));
}

TEST(Dequantize, RejectsPartialBlocks) {
  std::vector<uint8_t> raw(64);
  std::vector<float> out(64);
  EXPECT_THROW(dequantize_row(DType::Q4_0, raw.data(), out.data(), 31), Error);
  EXPECT_THROW(dequantize_row(static_cast<DType>(21), raw.data(), out.data(), 256),
               Error);  // IQ3_S
}

}  // namespace
}  // namespace cb
