// The chunk store on a Redis or Valkey server: a ChunkStore over
// RedisStore.  Lookups read the value's header, layers are read one
// GETRANGE at a time as the fusor asks for them, and new chunks are written
// back asynchronously so a miss never waits for the network (put_now, for
// an ingest, writes at once).  A server that is down or unreachable makes
// find and put throw cb::Error(kIo) with the store's last error, and one
// that refused a write makes put throw for the reconnect interval (a tiered
// store counts that as the tier failing and keeps the chunk elsewhere); one
// that is slow makes misses.  A value of another shape than the one asked
// for is a miss.
#pragma once

#include <memory>

#include "cache/chunk_store.h"
#include "cache/redis_store.h"

namespace cb::cache {

class RedisChunkStore final : public ChunkStore {
 public:
  explicit RedisChunkStore(std::shared_ptr<RedisStore> store) : store_(std::move(store)) {}
  std::unique_ptr<ChunkLayerSource> find(const ChunkKey& key, const KvShape& shape) override;
  // Queued for write-back; kIo when the server is known to be down (the
  // last read found it so, and a PING now does too), refused a write within
  // the reconnect interval (full, read-only, no SET permission), or the
  // queue is full: a tiered store then keeps the chunk in another tier.  A
  // write the server refuses later is counted in the store's stats.
  void put(const ChunkKey& key, ChunkKV kv) override;
  // Written now (SET); kIo with the server's answer when it is not stored.
  void put_now(const ChunkKey& key, ChunkKV kv) override;
  // After the write-backs queued before it, the value goes (DEL).
  bool remove(const ChunkKey& key) override {
    store_->flush();
    return store_->remove(key);
  }
  RedisStore& store() { return *store_; }
  const RedisStore& store() const { return *store_; }

 private:
  [[noreturn]] void unreachable() const;
  std::shared_ptr<RedisStore> store_;
};

}  // namespace cb::cache
