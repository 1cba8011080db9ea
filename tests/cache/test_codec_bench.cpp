// Codec measurements for docs/CACHE_STORE.md.  Disabled by default (timing,
// not correctness); run with
//   build/bin/test_cache --gtest_also_run_disabled_tests --gtest_filter='CodecBench.*'
// Shape: a chunk of SmolLM2-135M (30 layers, 512 tokens, 3 KV heads x 64).
#include <gtest/gtest.h>
#include <zstd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "cache/codec.h"
#include "cache/flash_store.h"
#include "cache_test_util.h"
#include "platform/half.h"

namespace cb::cache {
namespace {

using namespace testing;
using Clock = std::chrono::steady_clock;

constexpr KvShape kShape{30, 512, 3, 64};

double secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Measure {
  double bytes = 0, enc_s = 0, dec_s = 0, max_err = 0, rms_err_k = 0, rms_err_v = 0;
};

// Best of `reps` runs, so a busy neighbour on a shared machine inflates less.
Measure measure(Codec codec, const ChunkKV& kv, int level, int reps) {
  Measure m{0, 1e30, 1e30, 0, 0, 0};
  std::vector<std::vector<uint8_t>> segs(kShape.n_layers);
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int l = 0; l < kShape.n_layers; ++l) {
      segs[l].clear();
      encode_layer(codec, kShape, kv.k.data() + l * kShape.layer_floats(),
                   kv.v.data() + l * kShape.layer_floats(), level, segs[l]);
    }
    m.enc_s = std::min(m.enc_s, secs(t0));
  }
  for (const auto& s : segs) m.bytes += static_cast<double>(s.size());
  ChunkKV out(kShape);
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int l = 0; l < kShape.n_layers; ++l) {
      decode_layer(codec, kShape, segs[l].data(), segs[l].size(), out.k_layer(l), out.v_layer(l));
    }
    m.dec_s = std::min(m.dec_s, secs(t0));
  }
  double sk = 0, sv = 0, nk = 0, nv = 0;
  for (size_t i = 0; i < kv.k.size(); ++i) {
    const double ek = double{out.k[i]} - kv.k[i], ev = double{out.v[i]} - kv.v[i];
    m.max_err = std::max({m.max_err, std::fabs(ek), std::fabs(ev)});
    sk += ek * ek;
    sv += ev * ev;
    nk += double{kv.k[i]} * kv.k[i];
    nv += double{kv.v[i]} * kv.v[i];
  }
  m.rms_err_k = std::sqrt(sk / nk);  // relative to the data's rms
  m.rms_err_v = std::sqrt(sv / nv);
  return m;
}

TEST(CodecBench, DISABLED_DefaultModelChunk) {
  const ChunkKV kv = make_kv(kShape, 42);
  const double f16_bytes = 2.0 * 2 * kShape.n_layers * kShape.layer_floats();
  const double tokens = kShape.n_tokens;
  std::printf("chunk %d layers x %d tokens x kv_dim %lld; f16 = %.0f bytes/token\n",
              kShape.n_layers, kShape.n_tokens, static_cast<long long>(kShape.kv_dim()),
              f16_bytes / tokens);
  std::printf("%-5s %5s %10s %8s %11s %11s %9s %10s %10s\n", "codec", "zstd", "bytes/tok", "vs f16",
              "enc GB/s", "dec GB/s", "max err", "rms err K", "rms err V");
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    for (int level : {0, 1, 3, 9, 19}) {
      if (c == Codec::kF16 && level > 0) continue;  // f16 never uses zstd
      const Measure m = measure(c, kv, level, level >= 9 ? 1 : 5);
      std::printf("%-5s %5d %10.1f %8.3f %11.2f %11.2f %9.4f %10.5f %10.5f\n", codec_name(c), level,
                  m.bytes / tokens, m.bytes / f16_bytes, f16_bytes / m.enc_s / 1e9,
                  f16_bytes / m.dec_s / 1e9, m.max_err, m.rms_err_k, m.rms_err_v);
    }
  }
  // For reference: what zstd would buy on the raw f16 payload.
  std::vector<uint16_t> half(kv.k.size());
  f32_to_f16_n(kv.k.data(), half.data(), half.size());
  std::vector<uint8_t> z(ZSTD_compressBound(half.size() * 2));
  const size_t zn = ZSTD_compress(z.data(), z.size(), half.data(), half.size() * 2, 1);
  std::printf("zstd-1 on f16 K alone: %.3f of raw\n", static_cast<double>(zn) / (half.size() * 2));
}

// Whole fetch path from a warm page cache: pread + checksum + decode, per
// codec and zstd setting, one thread.  What the loader thread costs per chunk
// when storage is not the bottleneck.
TEST(CodecBench, DISABLED_StoreFetchWarm) {
  const ChunkKV kv = make_kv(kShape, 43);
  const double f16_bytes = 2.0 * 2 * kShape.n_layers * kShape.layer_floats();
  std::printf("%-5s %5s %12s %14s\n", "codec", "zstd", "ms/chunk", "GB/s f16-eq");
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    for (int level : {0, 1}) {
      if (c == Codec::kF16 && level > 0) continue;
      TempDir dir;
      StoreOptions opt;
      opt.zstd_level = level;
      auto store = FlashStore::open(dir.path(), opt);
      const ChunkKey key = make_key(make_tokens(kShape.n_tokens, 1), c);
      ASSERT_EQ(store->put(key, kv.view()), PutResult::kStored);
      ChunkKV out(kShape);
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = Clock::now();
        auto h = store->lookup(key);
        ASSERT_TRUE(h);
        for (int l = 0; l < kShape.n_layers; ++l) {
          ASSERT_TRUE(store->fetch_layer(*h, l, out.k_layer(l), out.v_layer(l)));
        }
        best = std::min(best, secs(t0));
      }
      std::printf("%-5s %5d %12.2f %14.2f\n", codec_name(c), level, best * 1e3,
                  f16_bytes / best / 1e9);
    }
  }
}

}  // namespace
}  // namespace cb::cache
