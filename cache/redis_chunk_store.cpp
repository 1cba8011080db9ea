#include "cache/redis_chunk_store.h"

#include "platform/error.h"

namespace cb::cache {

[[noreturn]] void RedisChunkStore::unreachable() const {
  fail(ErrorCode::kIo, "redis server unreachable: " + store_->stats().last_error);
}

std::unique_ptr<ChunkLayerSource> RedisChunkStore::find(const ChunkKey& key, const KvShape& shape) {
  std::optional<RedisChunkHandle> h = store_->lookup(key);
  if (!h) {
    if (!store_->reachable()) unreachable();
    return nullptr;
  }
  if (!(h->shape() == shape)) return nullptr;  // not this model's geometry: forged or foreign
  return std::make_unique<StoredChunkSource<RedisStore, RedisChunkHandle>>(store_, std::move(*h));
}

void RedisChunkStore::put(const ChunkKey& key, ChunkKV kv) {
  // Known down or refusing writes: refused here, so a tiered store keeps
  // the chunk elsewhere.
  if (!store_->reachable() && !store_->ping()) unreachable();
  if (store_->writes_refused())
    fail(ErrorCode::kIo, "redis server refuses writes: " + store_->stats().last_error);
  if (!store_->put_async(key, std::move(kv)))
    fail(ErrorCode::kIo, "redis write-back queue full: chunk not stored");
}

void RedisChunkStore::put_now(const ChunkKey& key, ChunkKV kv) {
  if (!store_->put(key, kv.view()))
    fail(ErrorCode::kIo, "redis server did not store the chunk: " + store_->stats().last_error);
}

}  // namespace cb::cache
