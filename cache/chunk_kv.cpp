#include "cache/chunk_kv.h"

#include <xxhash.h>

#include <cstring>

#include "platform/error.h"

namespace cb::cache {

const char* codec_name(Codec codec) {
  switch (codec) {
    case Codec::kF16:
      return "f16";
    case Codec::kQ8:
      return "q8";
    case Codec::kQ4:
      return "q4";
  }
  return "unknown";
}

std::optional<Codec> parse_codec(std::string_view name) {
  for (Codec c : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    if (name == codec_name(c)) return c;
  }
  return std::nullopt;
}

bool shape_matches_key(const KvShape& shape, const ChunkKey& key) {
  return shape.n_layers > 0 && shape.n_head_kv > 0 && shape.head_dim > 0 &&
         static_cast<size_t>(shape.n_tokens) == key.tokens.size() && !key.tokens.empty();
}

ChunkKV::ChunkKV(const KvShape& s)
    : shape(s),
      k(static_cast<size_t>(s.n_layers * s.layer_floats())),
      v(static_cast<size_t>(s.n_layers * s.layer_floats())) {}

ChunkKVView ChunkKV::view() const {
  ChunkKVView out;
  out.shape = shape;
  for (int l = 0; l < shape.n_layers; ++l) {
    out.k.push_back(k.data() + l * shape.layer_floats());
    out.v.push_back(v.data() + l * shape.layer_floats());
  }
  return out;
}

uint64_t hash_key(const ChunkKey& key, Codec codec) {
  // Length-prefix every variable field so ("ab","c") and ("a","bc") differ.
  XXH3_state_t* st = XXH3_createState();
  if (!st) fail(ErrorCode::kOutOfMemory, "XXH3_createState");
  XXH3_64bits_reset(st);
  auto add_str = [&](const std::string& s) {
    const uint64_t n = s.size();
    XXH3_64bits_update(st, &n, sizeof n);
    XXH3_64bits_update(st, s.data(), s.size());
  };
  add_str(key.ns);
  add_str(key.model_fingerprint);
  add_str(key.chunk_head);
  const uint8_t c = static_cast<uint8_t>(codec);
  XXH3_64bits_update(st, &c, 1);
  const uint64_t n = key.tokens.size();
  XXH3_64bits_update(st, &n, sizeof n);
  XXH3_64bits_update(st, key.tokens.data(), key.tokens.size() * sizeof(int32_t));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string serialize_key(const ChunkKey& key) {
  std::string s;
  for (const std::string* part : {&key.model_fingerprint, &key.chunk_head, &key.ns}) {
    s += std::to_string(part->size());
    s += ':';
    s += *part;
  }
  s += key.codec ? codec_name(*key.codec) : "-";
  s += ':';
  const size_t off = s.size();
  s.resize(off + key.tokens.size() * sizeof(int32_t));
  std::memcpy(s.data() + off, key.tokens.data(), key.tokens.size() * sizeof(int32_t));
  return s;
}

}  // namespace cb::cache
