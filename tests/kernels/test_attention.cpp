// attention against a float64 softmax: causal mask by global position, query
// rows that are an arbitrary subset of positions in arbitrary order, GQA,
// head sizes with SIMD tails, key counts that cross the kernel's blocks, and
// sliding windows that start inside a block, on its boundary, or past a
// query's keys, and a logit bias on a block of keys (AttentionArgs::key_bias)
// for the rows from a position on.
//
// Tolerance: 1e-5 absolute on outputs of magnitude ~1 (V ~ N(0,1)).  The f32
// paths are off by ~1e-7 (score rounding, a ~1e-7 polynomial exp); an
// off-by-one in the mask or a wrong KV head changes outputs by ~1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference_ops.h"

namespace cb {
namespace {

struct Case {
  int64_t n_head, n_head_kv, head_dim, n_kv;
  std::vector<int32_t> q_pos;
  int64_t window = 0;
  // AttentionArgs::key_bias (scalars: an omitted class member would warn).
  int64_t bias_begin = 0, bias_end = 0, bias_from = 0;
  float bias = 0.0f;
  KeyBlockBias key_bias() const { return {bias_begin, bias_end, bias_from, bias}; }
};

// What c's bias adds to the scaled score of query row i on key j.
double bias_f64(const Case& c, int64_t i, int64_t j) {
  return c.q_pos[i] >= c.bias_from && j >= c.bias_begin && j < c.bias_end ? c.bias : 0.0;
}

int64_t first_key(const Case& c, int64_t i) {
  return c.window > 0 ? std::max<int64_t>(0, c.q_pos[i] + 1 - c.window) : 0;
}

struct Data {
  std::vector<float> q, k, v;
  AttentionArgs args(const Case& c, float* out) const {
    AttentionArgs a;
    a.q = q.data();
    a.n_q = static_cast<int64_t>(c.q_pos.size());
    a.q_pos = c.q_pos.data();
    a.k = k.data();
    a.v = v.data();
    a.n_kv = c.n_kv;
    a.n_head = c.n_head;
    a.n_head_kv = c.n_head_kv;
    a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.window = c.window;
    a.key_bias = c.key_bias();
    a.out = out;
    return a;
  }
};

Data make_data(std::mt19937& rng, const Case& c) {
  const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
  return {test::random_floats(rng, n_q * c.n_head * c.head_dim, 1.5f),
          test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim, 1.5f),
          test::random_floats(rng, c.n_kv * c.n_head_kv * c.head_dim)};
}

std::vector<double> attention_f64(const Case& c, const Data& d) {
  const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
  const int64_t hd = c.head_dim, group = c.n_head / c.n_head_kv;
  const double scale = 1.0f / std::sqrt(static_cast<float>(hd));  // as the args
  std::vector<double> out(n_q * c.n_head * hd, 0.0);
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t n_keys = std::min<int64_t>(c.q_pos[i] + 1, c.n_kv), j0 = first_key(c, i);
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t g = h / group;
      std::vector<double> s(n_keys, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = j0; j < n_keys; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < hd; ++e) {
          dot += static_cast<double>(d.q[(i * c.n_head + h) * hd + e]) *
                 d.k[(j * c.n_head_kv + g) * hd + e];
        }
        s[j] = dot * scale + bias_f64(c, i, j);
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = j0; j < n_keys; ++j) {
        for (int64_t e = 0; e < hd; ++e) {
          out[(i * c.n_head + h) * hd + e] += s[j] / sum * d.v[(j * c.n_head_kv + g) * hd + e];
        }
      }
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  EXPECT_LE(worst, 1e-5) << what;
}

std::vector<Case> cases() {
  return {
      // SmolLM2 geometry; a subset of positions in arbitrary order, one past
      // the cache (sees only n_kv keys), keys crossing 32-key blocks.
      {9, 3, 64, 70, {69, 0, 33, 5, 31, 32, 64, 100, 12}},
      {4, 4, 20, 40, {39, 1, 17, 0}},   // no GQA; head size with a tail of 4
      {6, 2, 40, 33, {32, 31, 2, 30}},  // head size not a multiple of 16
      {2, 1, 128, 1000, {999, 517}},    // long context, wide heads
      // Sliding windows: starting mid-block for most rows; on a block
      // boundary (row 63: keys 32..63); wider than some rows' history.
      {9, 3, 64, 70, {69, 0, 33, 5, 31, 32, 64, 100, 12}, 20},
      {4, 1, 256, 300, {299, 63, 150, 40, 3}, 32},
      {2, 1, 128, 1000, {999, 517, 7}, 513},
      // A bias on keys 10..49 (crossing a block) for the rows from position
      // 33 on (rows 31, 32 and 5 pay none); a damping one and a boosting one.
      {9, 3, 64, 70, {69, 0, 33, 5, 31, 32, 64, 100, 12}, 0, 10, 50, 33, -0.5f},
      {4, 4, 20, 40, {39, 1, 17, 0}, 0, 0, 17, 17, 1.25f},
      // A long block of keys, with a sliding window over part of it.
      {2, 1, 128, 1000, {999, 517, 7, 600}, 0, 64, 960, 517, -2.0f},
      {9, 3, 64, 70, {69, 0, 33, 5, 31, 32, 64, 100, 12}, 20, 31, 64, 32, -0.7f},
  };
}

TEST(Attention, ReferenceMatchesFloat64) {
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    std::vector<float> out(d.q.size(), NAN);
    ref::attention(d.args(c, out.data()));
    expect_close(out, attention_f64(c, d), "ref");
  }
}

TEST(Attention, SimdMatchesFloat64) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(12);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    std::vector<float> out(d.q.size(), NAN);
    const AttentionArgs a = d.args(c, out.data());
    for (int64_t i = 0; i < a.n_q; ++i) {
      for (int64_t h = 0; h < a.n_head; ++h) simd->attention_tile(a, i, i + 1, h, h + 1);
    }
    expect_close(out, attention_f64(c, d), simd->name);
  }
}

// The tiled kernel: tiles of several query rows x the heads of one KV head,
// in every tiling, must match float64 and give bit-identical rows whatever
// the tiling (a row's result may not depend on its neighbours).
TEST(Attention, SimdTilesMatchFloat64AndEachOther) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(15);
  std::vector<Case> all = cases();
  // A prefill-like batch: 45 consecutive positions after 60 cached ones.
  Case prefill{8, 2, 72, 105, {}};  // head size with an 8-wide tail
  for (int32_t p = 60; p < 105; ++p) prefill.q_pos.push_back(p);
  all.push_back(prefill);
  all.push_back({3, 1, 13, 77, {76, 40, 3, 64, 65, 10, 0, 31, 32}});  // scalar dim tail
  for (const Case& c : all) {
    const Data d = make_data(rng, c);
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
    const int64_t group = c.n_head / c.n_head_kv;
    const std::vector<double> want = attention_f64(c, d);
    std::vector<float> first;
    for (int64_t q_block : {int64_t{1}, int64_t{4}, int64_t{7}, n_q}) {
      for (bool whole_group : {true, false}) {
        std::vector<float> out(d.q.size(), NAN);
        const AttentionArgs a = d.args(c, out.data());
        const int64_t heads = whole_group ? group : 1;
        for (int64_t q0 = 0; q0 < n_q; q0 += q_block) {
          for (int64_t h0 = 0; h0 < c.n_head; h0 += heads) {
            simd->attention_tile(a, q0, std::min(n_q, q0 + q_block), h0, h0 + heads);
          }
        }
        expect_close(out, want, "tiles");
        if (first.empty()) {
          first = out;
        } else {
          EXPECT_TRUE(test::bitwise_equal(out, first))
              << "q_block " << q_block << " whole_group " << whole_group;
        }
        if (HasFailure()) return;
      }
    }
  }
}

// The backend transposes each KV head's keys once for all of its tiles when
// it has several query blocks, as many heads at a time as fit in 4 MiB;
// that must give the bits of tiles that transpose what they read, whatever
// the thread count.
TEST(Attention, BackendWithSharedKeyTransposeMatchesTiles) {
  const test::SimdKernels* simd = test::simd_kernels();
  if (simd == nullptr) GTEST_SKIP() << "no SIMD kernels for this CPU";
  std::mt19937 rng(17);
  Case smol{9, 3, 64, 300, {}};  // 60 selected rows, out of order, the last one past the cache
  for (int32_t p = 299; p >= 0; p -= 5) smol.q_pos.push_back(p == 299 ? 400 : p);
  Case tail{8, 2, 72, 105, {}};  // 45 consecutive rows; a head size with an 8-wide tail
  for (int32_t p = 60; p < 105; ++p) tail.q_pos.push_back(p);
  Case longer{6, 2, 64, 9000, {}};  // 2.3 MB of keys per head: one head at a time
  for (int32_t p = 8976; p < 9000; ++p) longer.q_pos.push_back(p);
  for (const Case& c : {smol, tail, longer}) {
    const Data d = make_data(rng, c);
    const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
    const int64_t group = c.n_head / c.n_head_kv;
    std::vector<float> tiles(d.q.size(), NAN);
    const AttentionArgs a = d.args(c, tiles.data());
    for (int64_t h0 = 0; h0 < c.n_head; h0 += group)
      simd->attention_tile(a, 0, n_q, h0, h0 + group);
    expect_close(tiles, attention_f64(c, d), "tiles");
    for (int threads : {1, 3}) {
      std::vector<float> out(d.q.size(), NAN);
      make_cpu_backend(threads, simd->level)->attention(d.args(c, out.data()));
      EXPECT_TRUE(test::bitwise_equal(out, tiles)) << "head_dim " << c.head_dim << ", " << threads;
    }
  }
}

// Keys [begin, end) must not matter to any query row of c: change them and
// compare, bit for bit, at every kernel level.
void expect_keys_ignored(const Case& c, int64_t begin, int64_t end, unsigned seed) {
  std::mt19937 rng(seed);
  Data d = make_data(rng, c);
  Data changed = d;
  const int64_t row = c.n_head_kv * c.head_dim;
  for (int64_t i = begin * row; i < end * row; ++i) {
    changed.k[static_cast<size_t>(i)] = 100.0f;
    changed.v[static_cast<size_t>(i)] = -100.0f;
  }
  for (CpuKernelLevel level : test::all_levels()) {
    auto be = make_cpu_backend(2, level);
    std::vector<float> before(d.q.size()), after(d.q.size());
    be->attention(d.args(c, before.data()));
    be->attention(changed.args(c, after.data()));
    EXPECT_TRUE(test::bitwise_equal(before, after)) << "level " << static_cast<int>(level);
  }
}

// Keys after a query's position.
TEST(Attention, MaskedKeysAreIgnored) {
  expect_keys_ignored({4, 2, 32, 50, {20, 3}}, 21, 50, 13);
}

// Keys before a query's window: the rows see keys 104.. and 85...
TEST(Attention, KeysBeforeTheWindowAreIgnored) {
  expect_keys_ignored({4, 2, 32, 120, {119, 100}, 16}, 0, 85, 17);
}

TEST(Attention, BackendIndependentOfThreadCount) {
  std::mt19937 rng(14);
  const Case c = cases()[0];
  const Data d = make_data(rng, c);
  for (CpuKernelLevel level : test::all_levels()) {
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      std::vector<float> out(d.q.size());
      make_cpu_backend(threads, level)->attention(d.args(c, out.data()));
      if (threads == 1) {
        first = out;
        expect_close(out, attention_f64(c, d), "backend");
      } else {
        EXPECT_TRUE(test::bitwise_equal(out, first)) << threads;
      }
    }
  }
}

// Backend::attention_contributions in float64: per key, the attention
// weight over every query row and head times the norm of the key's value
// for that head's KV head.
std::vector<double> contributions_f64(const Case& c, const Data& d) {
  const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
  const int64_t hd = c.head_dim, group = c.n_head / c.n_head_kv;
  const double scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<double> out(static_cast<size_t>(c.n_kv), 0.0);
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t n_keys = std::min<int64_t>(c.q_pos[i] + 1, c.n_kv), j0 = first_key(c, i);
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t g = h / group;
      std::vector<double> s(n_keys, -INFINITY);
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = j0; j < n_keys; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < hd; ++e)
          dot += static_cast<double>(d.q[(i * c.n_head + h) * hd + e]) *
                 d.k[(j * c.n_head_kv + g) * hd + e];
        mx = std::max(mx, s[j] = dot * scale + bias_f64(c, i, j));
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = j0; j < n_keys; ++j) {
        double norm = 0.0;
        for (int64_t e = 0; e < hd; ++e) {
          const double v = d.v[(j * c.n_head_kv + g) * hd + e];
          norm += v * v;
        }
        out[j] += s[j] / sum * std::sqrt(norm);
      }
    }
  }
  return out;
}

TEST(AttentionContributions, MatchFloat64AtEveryLevelAndThreadCount) {
  std::mt19937 rng(16);
  for (const Case& c : cases()) {
    const Data d = make_data(rng, c);
    const std::vector<double> want = contributions_f64(c, d);
    for (CpuKernelLevel level : test::all_levels()) {
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        // Sums are added to what `out` holds.
        std::vector<float> out(static_cast<size_t>(c.n_kv), 1.0f);
        make_cpu_backend(threads, level)->attention_contributions(d.args(c, nullptr), out.data());
        double worst = 0.0;
        for (size_t j = 0; j < out.size(); ++j)
          worst = std::max(worst, std::fabs(out[j] - 1.0 - want[j]) / (1.0 + want[j]));
        EXPECT_LE(worst, 1e-5) << "level " << static_cast<int>(level) << ", " << threads
                               << " threads, heads " << c.n_head << "/" << c.n_head_kv;
        if (threads == 1)
          first = out;
        else
          EXPECT_TRUE(test::bitwise_equal(out, first)) << threads;
      }
    }
  }
}

TEST(Attention, RejectsBadHeadGrouping) {
  auto be = make_cpu_backend(1, CpuKernelLevel::kScalar);
  AttentionArgs a;
  a.n_head = 9;
  a.n_head_kv = 2;
  a.head_dim = 64;
  EXPECT_THROW(be->attention(a), Error);
}

}  // namespace
}  // namespace cb
