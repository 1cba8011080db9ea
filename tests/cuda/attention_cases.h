// Attention test cases shared by the CUDA tests on a GPU
// (test_cuda_attention.cpp) and the tiled kernel's run on the host
// (test_cuda_attn_tiles.cu, built by nvcc as C++17: nothing here may need
// more).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace cb::test {

struct AttnCase {
  int64_t n_head, n_head_kv, head_dim, n_kv;
  std::vector<int32_t> q_pos;
  int64_t window = 0;  // sliding window (gemma3's local layers); 0 = none
  KeyBlockBias key_bias = {};
};

// The arguments of one case over host vectors (out left null; q_pos points
// into c, which must outlive them).
inline AttentionArgs host_args(const AttnCase& c, const std::vector<float>& q,
                               const std::vector<float>& k, const std::vector<float>& v) {
  AttentionArgs a;
  a.q = q.data();
  a.q_pos = c.q_pos.data();
  a.n_q = static_cast<int64_t>(c.q_pos.size());
  a.k = k.data();
  a.v = v.data();
  a.n_kv = c.n_kv;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.window = c.window;
  a.key_bias = c.key_bias;
  return a;
}

// Query positions in any order, one of them negative (sees no key: zero
// output) and some past n_kv (see every key).
inline std::vector<int32_t> positions(int n, int32_t n_kv) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    p[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % (n_kv + 20));
  p[3] = -1;
  return p;
}

// A blend's rows: ascending, over the whole context.
inline std::vector<int32_t> spread(int n, int32_t n_kv) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i * n_kv / n);
  return p;
}

// A prefill chunk's rows: n consecutive positions from `from`.
inline std::vector<int32_t> consecutive(int n, int32_t from) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = from + i;
  return p;
}

// For the tiled kernel (head sizes 64, 128 and 256): GQA groups of 1, 3, 4,
// 6 and 7 (a block's queries: 64 / group, so a block's last rows are idle
// where the group does not divide 64), key counts that end inside a 64-key tile,
// rows in any order, a row seeing no key, positions past n_kv, a blend's
// spread rows, a prefill chunk's consecutive rows, sliding windows starting
// inside a tile and wider than a row's history, a key bias on a block of
// keys for some rows, and rows past a 1,024-key split.
inline std::vector<AttnCase> tiled_attention_cases() {
  return {
      {1, 1, 64, 1, {0}},
      {3, 1, 64, 70, {69, 0, 31, 32, 33, 5, 64, 65, 68}},
      {8, 2, 128, 257, {256, 128, 1, 255, 100, 300}},
      {4, 4, 256, 40, {39, 7, 12}},
      {9, 3, 64, 700, positions(200, 700)},
      {12, 2, 128, 1100, spread(300, 1100)},
      {14, 2, 64, 900, spread(130, 900)},
      {12, 2, 128, 600, consecutive(150, 450)},
      {4, 1, 256, 300, {299, 63, 150, 40, 3}, 32},
      {9, 3, 64, 700, positions(200, 700), 64},
      {8, 1, 128, 500, consecutive(100, 400), 100},
      {6, 2, 128, 300, spread(70, 300), 0, {10, 161, 150, -0.7f}},
      {4, 1, 64, 90, {89, 5, 30, 64, 70}, 0, {0, 33, 0, 2.3f}},
      {9, 3, 64, 700, positions(200, 700), 64, {100, 650, 300, -2.0f}},
      {4, 4, 256, 2100, spread(300, 2100), 0, {100, 1500, 1000, -1.2f}},
  };
}

}  // namespace cb::test
