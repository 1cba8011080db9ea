#include "cache/blob_format.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "cache/codec.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

constexpr char kMagic[8] = {'C', 'B', 'K', 'V', 'B', 'L', 'O', 'B'};
constexpr uint32_t kVersion = 1;
constexpr const char* kBlobSuffix = ".kv";
constexpr const char* kTempSuffix = ".tmp";

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

void check_view(const ChunkKVView& kv) {
  const KvShape& s = kv.shape;
  if (s.n_layers <= 0 || s.n_tokens <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0) {
    fail(ErrorCode::kInvalidArgument, "chunk KV shape must be positive in every dimension");
  }
  if (kv.k.size() != static_cast<size_t>(s.n_layers) ||
      kv.v.size() != static_cast<size_t>(s.n_layers)) {
    fail(ErrorCode::kInvalidArgument, "chunk KV view needs one K and one V pointer per layer");
  }
  for (int l = 0; l < s.n_layers; ++l) {
    if (!kv.k[l] || !kv.v[l]) fail(ErrorCode::kInvalidArgument, "chunk KV view has a null layer");
  }
}

}  // namespace

uint64_t segment_checksum(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

EncodedBlob encode_blob(Codec codec, const ChunkKVView& kv, uint64_t key_hash, int zstd_level) {
  check_view(kv);
  EncodedBlob blob;
  blob.bytes.assign(kBlobHeaderBytes, 0);
  uint8_t* h = blob.bytes.data();
  std::memcpy(h, kMagic, 8);
  std::memcpy(h + 8, &kVersion, 4);
  h[12] = static_cast<uint8_t>(codec);
  const int32_t dims[4] = {kv.shape.n_layers, kv.shape.n_tokens, kv.shape.n_head_kv,
                           kv.shape.head_dim};
  std::memcpy(h + 16, dims, sizeof dims);
  std::memcpy(h + 32, &key_hash, 8);

  for (int l = 0; l < kv.shape.n_layers; ++l) {
    const size_t start = blob.bytes.size();
    encode_layer(codec, kv.shape, kv.k[l], kv.v[l], zstd_level, blob.bytes);
    const size_t n = blob.bytes.size() - start;
    blob.segments.push_back(
        {start, static_cast<uint32_t>(n), segment_checksum(blob.bytes.data() + start, n)});
  }
  return blob;
}

std::string new_blob_name(uint64_t key_hash) {
  // Reseed after fork(): a child inherits its parent's generator state and
  // would otherwise draw the same names as its siblings.
  thread_local std::mt19937_64 rng;
  thread_local pid_t seeded_for = 0;
  if (seeded_for != getpid()) {
    seeded_for = getpid();
    std::random_device rd;
    rng.seed((uint64_t{rd()} << 32) ^ rd());
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016llx-%016llx%s", static_cast<unsigned long long>(key_hash),
                static_cast<unsigned long long>(rng()), kBlobSuffix);
  return buf;
}

std::string temp_name_for(const std::string& blob_name) {
  return blob_name + kTempSuffix;
}
bool is_blob_name(const std::string& name) {
  // Exactly what new_blob_name() writes: 16 hex digits, '-', 16, ".kv".
  if (name.size() != 33 + std::strlen(kBlobSuffix) || !ends_with(name, kBlobSuffix) ||
      name[16] != '-')
    return false;
  for (size_t i = 0; i < 33; ++i) {
    const char c = name[i];
    if (i != 16 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}
bool is_temp_name(const std::string& name) {
  return ends_with(name, kTempSuffix) &&
         is_blob_name(name.substr(0, name.size() - std::strlen(kTempSuffix)));
}

}  // namespace cb::cache
