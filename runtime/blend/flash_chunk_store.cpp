#include "runtime/blend/flash_chunk_store.h"

namespace cb {

std::unique_ptr<ChunkLayerSource> FlashChunkStore::find(const cache::ChunkKey& key) {
  std::optional<cache::ChunkHandle> h = store_->lookup(key);
  if (!h) return nullptr;
  return std::make_unique<StoredChunkSource<cache::FlashStore, cache::ChunkHandle>>(store_,
                                                                                    std::move(*h));
}

void FlashChunkStore::put(const cache::ChunkKey& key, cache::ChunkKV kv) {
  store_->put_async(key, std::move(kv));
}

}  // namespace cb
