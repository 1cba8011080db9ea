// What the store keeps: the KV of one text chunk, and the key it is found by.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cb::cache {

// On-disk representation of a chunk's KV.  The numeric values are written to
// the index and blob headers, so they never change meaning.
enum class Codec : uint8_t {
  kF16 = 1,  // raw binary16; exact up to f16 rounding
  kQ8 = 2,   // int8 per (token, head) with an f16 scale, then zstd
  kQ4 = 3,   // 4-bit: K per channel over 32-token groups, V per (token, head), then zstd
};
const char* codec_name(Codec codec);
std::optional<Codec> parse_codec(std::string_view name);  // "f16", "q8", "q4"

// Geometry of a chunk's KV.  kv_dim = n_head_kv * head_dim.
struct KvShape {
  int32_t n_layers = 0;
  int32_t n_tokens = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;

  int64_t kv_dim() const { return int64_t{n_head_kv} * head_dim; }
  int64_t layer_floats() const { return n_tokens * kv_dim(); }  // of K (or of V)
  bool operator==(const KvShape&) const = default;
};

// Borrowed KV of one chunk: for each layer, K and V each n_tokens x kv_dim f32
// row-major.  K is stored before RoPE so the chunk can be placed at any
// position.  Per-layer pointers let a caller hand rows of its own KV cache
// without copying.
struct ChunkKVView {
  KvShape shape;
  std::vector<const float*> k;  // n_layers pointers
  std::vector<const float*> v;
};

// Owned KV of one chunk, layer-major: layer l's K starts at k[l * layer_floats].
struct ChunkKV {
  KvShape shape;
  std::vector<float> k;
  std::vector<float> v;

  ChunkKV() = default;
  explicit ChunkKV(const KvShape& s);
  float* k_layer(int l) { return k.data() + l * shape.layer_floats(); }
  float* v_layer(int l) { return v.data() + l * shape.layer_floats(); }
  ChunkKVView view() const;
};

// Identifies a chunk's KV.  Everything that changes the KV is part of the key:
// the model, the chunk head the chunk was prefilled after, the codec and the
// exact token ids.  The namespace separates apps or users: a lookup in one
// namespace never sees another's entries.
struct ChunkKey {
  std::string model_fingerprint;  // bytes; e.g. a hash of the GGUF
  std::string chunk_head;         // id of the tokens the chunk was prefilled after
  std::optional<Codec> codec;     // unset: the store's default codec
  std::vector<int32_t> tokens;
  std::string ns;  // namespace; "" is the default one
};

// Whether a value of this shape can be the KV of the key's chunk: as many
// tokens as the key has token ids and every dimension positive.  A value read
// from any tier (its header or index row) that fails this is a miss whatever
// its checksums say: a value is trusted no further than its key, and sizes
// are never taken from the value alone.  The model's geometry (layers, KV
// heads, head size) is checked where the model is known (ChunkStore::find).
bool shape_matches_key(const KvShape& shape, const ChunkKey& key);

// 64-bit hash of every field of the key (codec resolved).  Used to find
// candidate rows; equality is always confirmed on the full key.
uint64_t hash_key(const ChunkKey& key, Codec codec);

// Every field of the key in one byte string (length-prefixed strings, the
// codec's name or "-" when unset, the token ids as raw int32): two keys
// serialize equal exactly when they are equal, so it can name an entry
// without a hash collision.
std::string serialize_key(const ChunkKey& key);

}  // namespace cb::cache
