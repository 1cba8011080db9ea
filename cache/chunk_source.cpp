#include "cache/chunk_source.h"

#include <cstring>

namespace cb::cache {

bool MemoryChunkSource::fetch_layer(int64_t layer, float* k, float* v) {
  if (layer < 0 || layer >= kv_.shape.n_layers) return false;
  const size_t n = static_cast<size_t>(kv_.shape.layer_floats());
  std::memcpy(k, kv_.k.data() + layer * n, n * sizeof(float));
  std::memcpy(v, kv_.v.data() + layer * n, n * sizeof(float));
  return true;
}

uint64_t MemoryChunkSource::layer_bytes(int64_t layer) const {
  if (layer < 0 || layer >= kv_.shape.n_layers) return 0;
  return 2 * static_cast<uint64_t>(kv_.shape.layer_floats()) * sizeof(float);
}

}  // namespace cb::cache
