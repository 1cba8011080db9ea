#include "cache/flash_chunk_store.h"

#include "platform/error.h"

namespace cb::cache {

std::unique_ptr<ChunkLayerSource> FlashChunkStore::find(const ChunkKey& key, const KvShape& shape) {
  std::optional<ChunkHandle> h = store_->lookup(key);
  if (!h || !(h->shape() == shape)) return nullptr;
  return std::make_unique<StoredChunkSource<FlashStore, ChunkHandle>>(store_, std::move(*h));
}

void FlashChunkStore::put(const ChunkKey& key, ChunkKV kv) {
  store_->put_async(key, std::move(kv));
}

void FlashChunkStore::put_now(const ChunkKey& key, ChunkKV kv) {
  if (store_->put(key, kv.view()) == PutResult::kNoRoom)
    fail(ErrorCode::kIo, "the chunk does not fit in the store at " + store_->dir());
}

}  // namespace cb::cache
