// The chunk store on a Redis or Valkey server: a ChunkStore over
// cache::RedisStore.  Lookups read the value's header, layers are read one
// GETRANGE at a time as the fusor asks for them, and new chunks are written
// back asynchronously so a miss never waits for the network.  A server that
// is down, slow or full makes misses and dropped puts, never errors.
#pragma once

#include <memory>

#include "cache/redis_store.h"
#include "runtime/blend/chunk_store.h"

namespace cb {

class RedisChunkStore final : public ChunkStore {
 public:
  explicit RedisChunkStore(std::shared_ptr<cache::RedisStore> store) : store_(std::move(store)) {}
  std::unique_ptr<ChunkLayerSource> find(const cache::ChunkKey& key) override;
  // Queued for write-back; dropped (and counted in the store's stats) when
  // the queue is full or the server refuses it.
  void put(const cache::ChunkKey& key, cache::ChunkKV kv) override;
  // After the write-backs queued before it, the value goes (DEL).
  bool remove(const cache::ChunkKey& key) override {
    store_->flush();
    return store_->remove(key);
  }
  cache::RedisStore& store() { return *store_; }
  const cache::RedisStore& store() const { return *store_; }

 private:
  std::shared_ptr<cache::RedisStore> store_;
};

}  // namespace cb
