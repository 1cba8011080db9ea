// The tiled attention kernel (kernels/cuda/cuda_attention_tiles.cuh) run on
// the host, where no GPU is: each thread block's phases run thread after
// thread (the kernel's own __host__ __device__ code: its indexing, masks,
// online softmax and sums), against the scalar reference (cb::ref::attention)
// at the GPU tests' tolerance.  Shared memory starts as NaN, so a read of
// something no phase wrote shows.  What only a GPU can show (the launch,
// the barriers, the device's expf) is Cuda.TiledAttentionMatchesReference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_attention_tiles.cuh"
#include "platform/half.h"
#include "tests/cuda/attention_cases.h"

namespace cb {
namespace {

template <int HD>
struct HostTileExec {
  std::vector<TileThread<HD>> st = std::vector<TileThread<HD>>(kTileThreads);
  template <class F>
  void phase(F&& f) {
    for (int t = 0; t < kTileThreads; ++t) f(t, st[static_cast<size_t>(t)]);
  }
};

// attention_tiles_kernel's grid, block after block, into partial results
// that start as NaN (the merge must read only what blocks wrote); then
// attention_merge_kernel's.
template <class T, int HD>
void tiles_on_host(const AttentionArgs& a, int64_t split_keys) {
  const int64_t group = a.n_head / a.n_head_kv, per_tile = kTileRows / group;
  const int64_t splits = (a.n_kv + split_keys - 1) / split_keys;
  std::vector<float> partial(static_cast<size_t>(splits * a.n_q * a.n_head * (HD + 2)), NAN);
  std::vector<float4> smem(TileLayout<HD>::kBytes / sizeof(float4) + 1);
  for (int64_t s = 0; s < splits; ++s) {
    for (int64_t kvh = 0; kvh < a.n_head_kv; ++kvh) {
      for (int64_t b = 0; b * per_tile < a.n_q; ++b) {
        float* sm = reinterpret_cast<float*>(smem.data());
        for (size_t i = 0; i < smem.size() * 4; ++i) sm[i] = NAN;
        HostTileExec<HD> ex;
        attention_tile_block<T, HD>(a, TileRows{b * per_tile, group, kvh, per_tile},
                                    TileSplit{split_keys, s}, partial.data(), sm, ex);
      }
    }
  }
  for (int64_t qi = 0; qi < a.n_q; ++qi) {
    for (int64_t e = 0; e < a.n_head * HD; ++e) {
      a.out[qi * a.n_head * HD + e] = merge_tile_partials<HD>(a, partial.data(), split_keys, qi,
                                                              e / HD, static_cast<int>(e % HD));
    }
  }
}

// split_keys 0: the backend's (kTileSplitKeys).
template <class T>
void run_tiles(const AttentionArgs& a, int64_t split_keys = 0) {
  if (split_keys == 0) split_keys = kTileSplitKeys;
  switch (a.head_dim) {
    case 64:
      return tiles_on_host<T, 64>(a, split_keys);
    case 128:
      return tiles_on_host<T, 128>(a, split_keys);
    case 256:
      return tiles_on_host<T, 256>(a, split_keys);
    default:
      FAIL() << "no tiled kernel for head_dim " << a.head_dim;
  }
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// The kernel's output and the reference's for one case; f16: the cache
// holds f16 values (the reference reads them widened).
void check_case(std::mt19937& rng, const test::AttnCase& c, bool f16, int64_t split_keys) {
  const int64_t n_q = static_cast<int64_t>(c.q_pos.size());
  const int64_t kv_elems = c.n_kv * c.n_head_kv * c.head_dim;
  const std::vector<float> q = random_floats(rng, n_q * c.n_head * c.head_dim);
  std::vector<float> k = random_floats(rng, kv_elems), v = random_floats(rng, kv_elems);
  std::vector<uint16_t> k16(static_cast<size_t>(kv_elems)), v16(k16.size());
  for (size_t i = 0; i < k16.size(); ++i) {
    k16[i] = f32_to_f16(k[i]);
    v16[i] = f32_to_f16(v[i]);
    if (f16) {
      k[i] = f16_to_f32(k16[i]);
      v[i] = f16_to_f32(v16[i]);
    }
  }
  AttentionArgs a = test::host_args(c, q, k, v);
  std::vector<float> expect(q.size()), got(q.size(), NAN);
  a.out = expect.data();
  ref::attention(a);
  AttentionArgs t = a;
  t.out = got.data();
  if (f16) {
    t.kv_type = DType::F16;
    t.k = k16.data();
    t.v = v16.data();
    run_tiles<uint16_t>(t, split_keys);
  } else {
    run_tiles<float>(t, split_keys);
  }
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - expect[i]) <= 1e-5) && ++bad <= 3) {
      ADD_FAILURE() << (f16 ? "f16" : "f32") << " heads " << c.n_head << "/" << c.n_head_kv
                    << " head_dim " << c.head_dim << " rows " << n_q << " keys " << c.n_kv
                    << " window " << c.window << " bias " << c.key_bias.bias << " split "
                    << split_keys << " at " << i << " (row "
                    << i / static_cast<size_t>(c.n_head * c.head_dim) << "): " << got[i] << " vs "
                    << expect[i];
    }
  }
}

// test::tiled_attention_cases() on f32 and f16 caches with the backend's
// splits of the keys (1,024), and on f32 with splits of 128 keys, so that
// rows cross several.
TEST(CudaAttentionTiles, BlocksMatchTheReference) {
  std::mt19937 rng(21);
  const std::vector<test::AttnCase> cases = test::tiled_attention_cases();
  for (const test::AttnCase& c : cases) {
    check_case(rng, c, false, 0);
    check_case(rng, c, true, 0);
    check_case(rng, c, false, 128);
  }
}

// A row's output is the same whichever rows share its block: alone, or
// among a prefill chunk's or a blend's rows (what makes a blend's recomputed
// rows equal to full prefill's, bit for bit, on the same kernel); with
// splits of 128 keys, so that rows cross several.
TEST(CudaAttentionTiles, ARowsResultDoesNotDependOnItsBlock) {
  std::mt19937 rng(5);
  const int64_t n_head = 12, n_head_kv = 2, hd = 128, n_kv = 700;
  const std::vector<float> k = random_floats(rng, n_kv * n_head_kv * hd);
  const std::vector<float> v = random_floats(rng, n_kv * n_head_kv * hd);
  const std::vector<int32_t> all = test::consecutive(static_cast<int>(n_kv), 0);
  const std::vector<float> q_all = random_floats(rng, n_kv * n_head * hd);
  auto run = [&](const std::vector<int32_t>& pos) {
    std::vector<float> q(pos.size() * static_cast<size_t>(n_head * hd));
    for (size_t i = 0; i < pos.size(); ++i)
      std::memcpy(q.data() + i * n_head * hd, q_all.data() + pos[i] * n_head * hd,
                  sizeof(float) * n_head * hd);
    std::vector<float> out(q.size(), NAN);
    const test::AttnCase c{n_head, n_head_kv, hd, n_kv, pos};
    AttentionArgs a = test::host_args(c, q, k, v);
    a.out = out.data();
    run_tiles<float>(a, 128);
    return out;
  };
  const std::vector<float> full = run(all);
  const std::vector<int32_t> chosen = {3, 64, 65, 200, 201, 333, 512, 699};
  const std::vector<float> blend = run(chosen);
  const size_t row = static_cast<size_t>(n_head * hd);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const std::vector<float> alone = run({chosen[i]});
    EXPECT_EQ(0, std::memcmp(alone.data(), full.data() + chosen[i] * row, row * sizeof(float)))
        << "position " << chosen[i] << " alone vs in a prefill";
    EXPECT_EQ(0, std::memcmp(alone.data(), blend.data() + i * row, row * sizeof(float)))
        << "position " << chosen[i] << " alone vs among a blend's rows";
  }
}

}  // namespace
}  // namespace cb
