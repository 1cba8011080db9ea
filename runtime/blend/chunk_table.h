// Where chunk KV is found by key and new chunk KV is kept: the small
// interface between the fusor's caller and a cache.  MemoryChunkTable keeps
// entries in RAM; the flash store (cache/) implements the same interface.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cache/chunk_kv.h"
#include "runtime/blend/chunk_source.h"

namespace cb {

class ChunkKvStore {
 public:
  virtual ~ChunkKvStore() = default;
  // A reader of the chunk's layers, or null on a miss.  The reader stays
  // valid even if the entry is evicted meanwhile.
  virtual std::unique_ptr<ChunkLayerSource> find(const cache::ChunkKey& key) = 0;
  virtual void put(const cache::ChunkKey& key, cache::ChunkKV kv) = 0;
  // Drops the entry, if any (readers already handed out stay valid).
  // false: there was none.
  virtual bool remove(const cache::ChunkKey& key) = 0;
};

// Chunk KV in RAM, exact (f32).  Thread-safe.
class MemoryChunkTable final : public ChunkKvStore {
 public:
  std::unique_ptr<ChunkLayerSource> find(const cache::ChunkKey& key) override;
  void put(const cache::ChunkKey& key, cache::ChunkKV kv) override;
  bool remove(const cache::ChunkKey& key) override;
  size_t size() const;
  size_t bytes() const;
  void clear();

 private:
  mutable std::mutex mu_;
  // Keyed by every field of the key, serialized: no hash collisions.
  std::unordered_map<std::string, std::shared_ptr<const cache::ChunkKV>> entries_;
  size_t bytes_ = 0;
};

}  // namespace cb
