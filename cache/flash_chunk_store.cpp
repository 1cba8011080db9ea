#include "cache/flash_chunk_store.h"

#include "platform/error.h"

namespace cb::cache {

std::unique_ptr<ChunkLayerSource> FlashChunkStore::find(const cache::ChunkKey& key,
                                                        const cache::KvShape& shape) {
  std::optional<cache::ChunkHandle> h = store_->lookup(key);
  if (!h || !(h->shape() == shape)) return nullptr;
  return std::make_unique<StoredChunkSource<cache::FlashStore, cache::ChunkHandle>>(store_,
                                                                                    std::move(*h));
}

void FlashChunkStore::put(const cache::ChunkKey& key, cache::ChunkKV kv) {
  store_->put_async(key, std::move(kv));
}

void FlashChunkStore::put_now(const cache::ChunkKey& key, cache::ChunkKV kv) {
  if (store_->put(key, kv.view()) == cache::PutResult::kNoRoom)
    fail(ErrorCode::kIo, "the chunk does not fit in the store at " + store_->dir());
}

}  // namespace cb::cache
