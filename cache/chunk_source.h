// Where a cached chunk's KV comes from, a layer at a time: the interface
// the fusor and the layerwise pipeline read through, implemented by the
// chunk store in RAM and the storage tiers (flash, Redis).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "cache/chunk_kv.h"

namespace cb::cache {

class ChunkLayerSource {
 public:
  virtual ~ChunkLayerSource() = default;
  // Writes layer `layer`'s K (before RoPE) and V, n_tokens x kv_dim floats
  // each.  Returns false if they cannot be read (corrupt, evicted): the
  // fusor then computes the chunk instead.
  // May be called from the fusor's loader thread (runtime/blend/layer_pipeline.h), one
  // call at a time per source.
  virtual bool fetch_layer(int64_t layer, float* k, float* v) = 0;
  // What fetch_layer(layer) reads, without reading it: stored bytes (0:
  // unknown) and their codec (none: plain floats already in RAM).  The
  // loading controller's T_load input and the per-request bytes_read.
  virtual uint64_t layer_bytes(int64_t /*layer*/) const { return 0; }
  virtual std::optional<Codec> codec() const { return std::nullopt; }
  // The chunk's KV geometry when the source knows it (a store's sources
  // do); what a copy of the chunk into another store is sized by.
  virtual std::optional<KvShape> shape() const { return std::nullopt; }
};

// A ChunkLayerSource over KV held in memory.
class MemoryChunkSource final : public ChunkLayerSource {
 public:
  explicit MemoryChunkSource(const ChunkKV& kv) : kv_(kv) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override;
  uint64_t layer_bytes(int64_t layer) const override;
  std::optional<KvShape> shape() const override { return kv_.shape; }

 private:
  const ChunkKV& kv_;
};

// A ChunkLayerSource over a handle of a storage tier (FlashStore's
// ChunkHandle, RedisStore's RedisChunkHandle): the handle keeps the
// entry readable, the shared store outlives the source.  A segment the store
// cannot read or verify is false: the fusor computes the chunk instead.
template <class Store, class Handle>
class StoredChunkSource final : public ChunkLayerSource {
 public:
  StoredChunkSource(std::shared_ptr<Store> store, Handle handle)
      : store_(std::move(store)), handle_(std::move(handle)) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    return in_range(layer) && store_->fetch_layer(handle_, static_cast<int>(layer), k, v);
  }
  uint64_t layer_bytes(int64_t layer) const override {
    return in_range(layer) ? handle_.layer_bytes(static_cast<int>(layer)) : 0;
  }
  std::optional<Codec> codec() const override { return handle_.codec(); }
  std::optional<KvShape> shape() const override { return handle_.shape(); }

 private:
  bool in_range(int64_t layer) const { return layer >= 0 && layer < handle_.n_layers(); }

  std::shared_ptr<Store> store_;
  Handle handle_;
};

}  // namespace cb::cache
