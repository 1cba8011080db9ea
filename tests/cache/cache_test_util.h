// Shared helpers for the chunk-store tests: temporary directories, KV-like
// synthetic data and keys, the codecs' error bounds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"
#include "cache/flash_store.h"
#include "platform/half.h"

namespace cb::cache::testing {

// The error bounds codec.h states for one group of values: half a
// quantization step plus the f16 rounding of the group's scale and offset.
// q8: the group's n values at x.
inline double q8_bound(const float* x, int n) {
  double a = 0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(double{x[i]}));
  return a / 254 + a * std::ldexp(1.0, -10) + std::ldexp(1.0, -20);
}
// q4: a group whose values range over [lo, hi].
inline double q4_bound(double lo, double hi) {
  return (hi - lo) / 30 + (std::fabs(lo) + std::fabs(hi)) * std::ldexp(1.0, -10) +
         std::ldexp(1.0, -20);
}

// A fresh directory under TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cb_cache_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// KV with the structure that matters to the codecs: keys have per-channel
// offsets and scales plus a few outlier channels with large magnitude; values
// are zero-mean with milder per-channel scales.
inline ChunkKV make_kv(const KvShape& shape, uint64_t seed) {
  ChunkKV kv(shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int64_t D = shape.kv_dim();
  for (int l = 0; l < shape.n_layers; ++l) {
    std::vector<float> k_mean(D), k_scale(D), v_scale(D);
    for (int64_t c = 0; c < D; ++c) {
      k_mean[c] = 0.5f * n01(rng);
      k_scale[c] = std::exp(0.5f * n01(rng));
      v_scale[c] = 0.3f * std::exp(0.3f * n01(rng));
    }
    for (int64_t c = 3; c < D; c += 61) {  // outlier channels
      k_mean[c] *= 8.0f;
      k_scale[c] *= 6.0f;
    }
    float* k = kv.k_layer(l);
    float* v = kv.v_layer(l);
    for (int64_t t = 0; t < shape.n_tokens; ++t) {
      for (int64_t c = 0; c < D; ++c) {
        k[t * D + c] = k_mean[c] + k_scale[c] * n01(rng);
        v[t * D + c] = v_scale[c] * n01(rng);
      }
    }
  }
  return kv;
}

inline std::vector<int32_t> make_tokens(int n, int32_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 7919 + i * 31) % 49152;
  return t;
}

inline ChunkKey make_key(const std::vector<int32_t>& tokens, Codec codec = Codec::kF16,
                         const std::string& ns = "") {
  ChunkKey key;
  key.model_fingerprint = "model-A";
  key.chunk_head = "bos";
  key.codec = codec;
  key.tokens = tokens;
  key.ns = ns;
  return key;
}

// Every layer of a hit, or nullopt if any layer failed.
inline std::optional<ChunkKV> fetch_all(FlashStore& store, const ChunkHandle& h) {
  ChunkKV out(h.shape());
  for (int l = 0; l < h.n_layers(); ++l) {
    if (!store.fetch_layer(h, l, out.k_layer(l), out.v_layer(l))) return std::nullopt;
  }
  return out;
}

// True if got is exactly the f16 rounding of want (the f16 codec's contract).
inline bool equals_f16_of(const ChunkKV& got, const ChunkKV& want) {
  if (!(got.shape == want.shape)) return false;
  for (size_t i = 0; i < want.k.size(); ++i) {
    if (got.k[i] != f16_to_f32(f32_to_f16(want.k[i]))) return false;
    if (got.v[i] != f16_to_f32(f32_to_f16(want.v[i]))) return false;
  }
  return true;
}

inline KvShape small_shape() {
  return {4, 40, 3, 8};
}  // 40 tokens: a partial q4 K group

}  // namespace cb::cache::testing
