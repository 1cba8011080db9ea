// CUDA attention against the scalar reference (cb::ref): both paths (the
// kernel below 32 query rows, with its keys split or not, cuBLAS above), GQA, sliding windows, f32
// and f16 caches, query rows in any order, a logit bias on a block of keys (the context scale), and
// the question's attention contributions against the CPU backend's.  Without a CUDA device every
// test skips with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "platform/half.h"
#include "tests/cuda/attention_cases.h"
#include "tests/cuda/cuda_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

using test::Cuda;

using test::AttnCase;
using test::host_args;
using test::positions;
using test::spread;

// Every case on `be`, with f32 and f16 caches, against ref::attention; `dev`
// puts a host vector in device-readable memory.
template <class Dev>
void expect_attention_matches_reference(Backend& be, Dev&& dev, const std::vector<AttnCase>& cases,
                                        std::mt19937& rng) {
  for (const bool f16 : {false, true}) {
    for (const AttnCase& c : cases) {
      const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
      const int64_t kv_elems = c.n_kv * c.n_head_kv * c.head_dim;
      const std::vector<float> q = test::random_floats(rng, n_q * c.n_head * c.head_dim);
      std::vector<float> k = test::random_floats(rng, kv_elems);
      std::vector<float> v = test::random_floats(rng, kv_elems);
      std::vector<uint16_t> k16(static_cast<size_t>(kv_elems)), v16(k16.size());
      if (f16) {  // the reference gets exactly the values the cache holds
        for (size_t i = 0; i < k16.size(); ++i) {
          k16[i] = f32_to_f16(k[i]);
          v16[i] = f32_to_f16(v[i]);
          k[i] = f16_to_f32(k16[i]);
          v[i] = f16_to_f32(v16[i]);
        }
      }
      std::vector<float> expect(q.size());
      AttentionArgs a = host_args(c, q, k, v);
      a.out = expect.data();
      ref::attention(a);
      AttentionArgs d = a;
      d.q = dev(q);
      d.q_pos = dev(c.q_pos);
      if (f16) {
        d.kv_type = DType::F16;
        d.k = dev(k16);
        d.v = dev(v16);
      } else {
        d.k = dev(k);
        d.v = dev(v);
      }
      d.out = dev(std::vector<float>(q.size(), NAN));
      be.attention(d);
      const std::vector<float> got(d.out, d.out + q.size());  // managed memory
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (!(std::fabs(got[i] - expect[i]) <= 1e-5) && ++bad <= 3) {
          ADD_FAILURE() << (f16 ? "f16" : "f32") << " heads " << c.n_head << "/" << c.n_head_kv
                        << " head_dim " << c.head_dim << " rows " << n_q << " bias "
                        << c.key_bias.bias << " at " << i << ": " << got[i] << " vs " << expect[i];
        }
      }
    }
  }
}

// Both paths: fewer than 32 query rows run the kernel, more go through
// cuBLAS (scores by GEMM, softmax over each row's visible keys, a GEMM with
// V).  Query rows are a subset of positions in any order, including a
// negative one (sees no key: zero output) and positions past n_kv (see
// every key); GQA groups of 1, 3 and 4; head sizes that are not a multiple
// of 32; key counts that cross the kernel's 32-key tiles; sliding windows
// starting inside a tile, on a tile boundary, wider than a row's history;
// f32 and f16 caches (the reference reads the widened values); many rows
// ascending over the whole context (a blend's) or in any order; a key bias
// (up or down, for some rows only, its block starting and ending inside a
// tile, with a window) on both paths; rows in a second block of scores.
TEST_F(Cuda, AttentionMatchesReference) {
  std::mt19937 rng(12);
  const std::vector<AttnCase> cases = {
      {1, 1, 64, 1, {0}},
      {3, 1, 64, 70, {69, 0, 31, 32, 33, 5}},
      {6, 2, 72, 100, {99, 40, -1, 63, 64, 200}},
      {8, 2, 128, 257, {256, 128, 1, 255, 100}},
      {4, 4, 256, 40, {39, 7, 12}},
      {2, 1, 17, 33, {32, 31, 0}},
      {4, 1, 256, 300, {299, 63, 150, 40, 3}, 32},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}, 20},
      {6, 2, 72, 100, positions(40, 100)},
      {8, 2, 128, 300, positions(70, 300)},
      {2, 1, 17, 33, positions(33, 33)},
      {4, 1, 64, 300, positions(64, 300), 32},
      {12, 2, 128, 520, positions(512, 520)},
      {12, 2, 128, 1100, spread(300, 1100)},
      {9, 3, 64, 700, positions(200, 700), 64},
      {6, 2, 72, 100, {99, 40, -1, 63, 64, 200}, 0, {10, 61, 50, -0.7f}},
      {4, 1, 64, 90, {89, 5, 30}, 0, {0, 33, 0, 2.3f}},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}, 20, {45, 70, 60, 1.1f}},
      {8, 2, 128, 300, positions(70, 300), 0, {3, 250, 100, -1.6f}},
      {12, 2, 128, 1100, spread(300, 1100), 0, {0, 1000, 1000, 0.9f}},
      {9, 3, 64, 700, positions(200, 700), 64, {100, 650, 300, -2.0f}},
      // Rows past the first block of scores (256 rows of 64 heads x 2048
      // keys): their positions and bias come from the block's offset.
      {64, 8, 16, 2048, spread(300, 2048), 0, {100, 1500, 1000, -1.2f}},
  };
  expect_attention_matches_reference(
      *be_, [&](const auto& v) { return dev(v); }, cases, rng);
}

// CB_CUDA_ATTN=tiles: attention of 32 or more rows by attention_tiles_kernel
// (head sizes 64, 128 and 256; other shapes keep the cuBLAS path), on the
// cases test_cuda_host runs on the host and one the kernel leaves to
// cuBLAS; a row's output the same bits whichever rows share its call (a
// blend's rows against a prefill's); a bad value refused.
TEST_F(Cuda, TiledAttentionMatchesReference) {
  setenv("CB_CUDA_ATTN", "tiles", 1);
  CudaBackendOptions o;
  o.memory = CudaMemory::kManaged;
  std::unique_ptr<Backend> tiles = make_cuda_backend(0, o);
  unsetenv("CB_CUDA_ATTN");
  std::mt19937 rng(13);
  std::vector<AttnCase> cases = test::tiled_attention_cases();
  cases.push_back({6, 2, 72, 100, positions(40, 100)});  // no tiled kernel: cuBLAS
  expect_attention_matches_reference(
      *tiles, [&](const auto& v) { return dev(v); }, cases, rng);
  EXPECT_GT(cuda_attention_tiles_launches(*tiles), 0);
  EXPECT_EQ(cuda_attention_tiles_launches(*be_), 0);

  // 40 rows of a prefill chunk and 40 spread rows sharing 8 positions.
  const int64_t n_head = 12, n_head_kv = 2, hd = 128, n_kv = 800;
  const std::vector<float> k = test::random_floats(rng, n_kv * n_head_kv * hd);
  const std::vector<float> v = test::random_floats(rng, n_kv * n_head_kv * hd);
  const std::vector<float> q_at = test::random_floats(rng, n_kv * n_head * hd);  // per position
  const size_t row = static_cast<size_t>(n_head * hd);
  auto run = [&](const std::vector<int32_t>& pos) {
    std::vector<float> q(pos.size() * row);
    for (size_t i = 0; i < pos.size(); ++i)
      std::copy_n(q_at.begin() + pos[i] * static_cast<int64_t>(row), row, q.begin() + i * row);
    const AttnCase c{n_head, n_head_kv, hd, n_kv, pos};
    AttentionArgs a = host_args(c, q, k, v);
    a.q = dev(q);
    a.q_pos = dev(pos);
    a.k = dev(k);
    a.v = dev(v);
    float* out = dev(std::vector<float>(q.size(), NAN));
    a.out = out;
    tiles->attention(a);
    return host(out, q.size());
  };
  std::vector<int32_t> prefill(40), blend(40);
  for (int i = 0; i < 40; ++i) {
    prefill[static_cast<size_t>(i)] = 600 + i;
    blend[static_cast<size_t>(i)] = i < 8 ? 600 + 5 * i : 20 * i;
  }
  std::sort(blend.begin(), blend.end());
  const std::vector<float> from_prefill = run(prefill), from_blend = run(blend);
  for (size_t i = 0; i < blend.size(); ++i) {
    if (blend[i] < 600 || blend[i] >= 640) continue;
    const size_t p = static_cast<size_t>(blend[i] - 600);
    EXPECT_TRUE(std::equal(from_blend.begin() + i * row, from_blend.begin() + (i + 1) * row,
                           from_prefill.begin() + p * row))
        << "position " << blend[i];
  }

  setenv("CB_CUDA_ATTN", "flash", 1);
  try {
    make_cuda_backend(0, o);
    ADD_FAILURE() << "CB_CUDA_ATTN=flash was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CB_CUDA_ATTN"), std::string::npos) << e.what();
  }
  unsetenv("CB_CUDA_ATTN");
}

// CB_CUDA_ATTN_SPLIT: attention of fewer than 32 rows with the keys split
// across blocks of 256 (head sizes 64, 128 and 256, more than 256 keys;
// else one block a row and head, as without it): decode rows over a long
// context (a 4,158-token request's), rows seeing no key, rows past n_kv,
// rows whose keys start or end inside a split, sliding windows, a key
// bias; then the same call probed, captured and replayed (a decode graph),
// the same bits each time.
TEST_F(Cuda, SplitAttentionMatchesReference) {
  setenv("CB_CUDA_ATTN_SPLIT", "1", 1);
  CudaBackendOptions o;
  o.memory = CudaMemory::kManaged;
  std::unique_ptr<Backend> split = make_cuda_backend(0, o);
  unsetenv("CB_CUDA_ATTN_SPLIT");
  std::mt19937 rng(14);
  const std::vector<AttnCase> cases = {
      {12, 2, 128, 4158, {4157}},
      {12, 2, 128, 4200, {4157, 300, 255, 256, 257, -1, 5000}},
      {14, 2, 64, 1100, {1099, 511, 512, 0}},
      {4, 4, 256, 700, {699, 300}, 300},
      {9, 3, 64, 2048, {2047, 1000}, 1024},
      {12, 2, 128, 1100, {1099, 700}, 0, {10, 900, 700, -0.7f}},
      {8, 1, 128, 257, {256, 255}},
      {6, 2, 72, 1000, {999, 500}},  // head size 72: not split
      {3, 1, 64, 200, {199}},        // one split's keys: not split
  };
  expect_attention_matches_reference(
      *split, [&](const auto& v) { return dev(v); }, cases, rng);

  const AttnCase c{12, 2, 128, 4096, {3000}};
  const std::vector<float> q = test::random_floats(rng, 12 * 128);
  const std::vector<float> k = test::random_floats(rng, 4096 * 2 * 128);
  const std::vector<float> v = test::random_floats(rng, 4096 * 2 * 128);
  AttentionArgs a = host_args(c, q, k, v);
  a.q = dev(q);
  a.q_pos = dev(c.q_pos);
  a.k = dev(k);
  a.v = dev(v);
  float* out = dev(std::vector<float>(q.size(), NAN));
  a.out = out;
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    std::fill(out, out + q.size(), NAN);
    if (split->begin_replay(3) != Backend::ReplayStart::kReplayed) split->attention(a);
    split->end_batch();
    const std::vector<float> got = host(out, q.size());
    if (run == 0) first = got;
    EXPECT_TRUE(test::bitwise_equal(got, first)) << "run " << run;
  }
  split->forget_replay(3);
}

// The same sums as the CPU backend, from device K/V into host memory.
TEST_F(Cuda, AttentionContributionsMatchCpu) {
  std::mt19937 rng(8);
  std::vector<int32_t> many(40);  // a question's rows at the end of a long context
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>(260 + i);
  std::vector<int32_t> spread(300);  // a blend's rows: over the whole context
  for (size_t i = 0; i < spread.size(); ++i) spread[i] = static_cast<int32_t>(i * 3 + 1);
  const std::vector<AttnCase> cases = {
      {12, 2, 128, 300, many},
      {12, 2, 128, 900, spread},
      {9, 3, 64, 70, {69, 0, 31, 32, 33, 5}},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}},
      {2, 1, 17, 33, {32, 31, 0}},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}, 20},
      {12, 2, 128, 300, many, 0, {0, 256, 256, -0.7f}},
      {12, 2, 128, 900, spread, 0, {40, 700, 300, 1.4f}},
      {9, 3, 64, 70, {69, 0, 31, 32, 33, 5}, 0, {5, 40, 30, 0.8f}},
      {6, 2, 72, 100, {99, 40, 63, 64, 200}, 20, {45, 70, 60, 1.1f}},
  };
  for (const AttnCase& c : cases) {
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
    const std::vector<float> q = test::random_floats(rng, n_q * c.n_head * c.head_dim);
    const std::vector<float> k = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    const std::vector<float> v = test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim);
    AttentionArgs a = host_args(c, q, k, v);
    std::vector<float> expect(static_cast<size_t>(c.n_kv), 0.0f);
    make_cpu_backend(1, CpuKernelLevel::kScalar)->attention_contributions(a, expect.data());
    AttentionArgs d = a;
    d.q = dev(q);
    d.q_pos = dev(c.q_pos);
    d.k = dev(k);
    d.v = dev(v);
    std::vector<float> got(static_cast<size_t>(c.n_kv), 0.0f);
    be_->attention_contributions(d, got.data());
    for (size_t j = 0; j < got.size(); ++j)
      EXPECT_NEAR(got[j], expect[j], 1e-4 * (1.0 + std::fabs(expect[j])))
          << "key " << j << ", bias " << c.key_bias.bias;
  }
}

// One query at position pos, one head of head_dim, over pos + 1 keys, every
// array `buf` (which must hold head_dim floats).
AttentionArgs one_query(std::vector<float>& buf, const int32_t& pos, int64_t head_dim) {
  AttentionArgs a;
  a.q = buf.data();
  a.q_pos = &pos;
  a.n_q = 1;
  a.k = buf.data();
  a.v = buf.data();
  a.n_kv = pos + 1;
  a.n_head = 1;
  a.n_head_kv = 1;
  a.head_dim = head_dim;
  a.scale = 1.0f;
  a.out = buf.data();
  return a;
}

TEST_F(Cuda, AttentionRejectsOversizedHeads) {
  std::vector<float> buf(512, 0.0f);
  const int32_t pos = 0;
  EXPECT_THROW(be_->attention(one_query(buf, pos, 512)), Error);
}

}  // namespace
}  // namespace cb
