// The chunk store on flash: a ChunkStore over FlashStore.  Lookups
// read the SQLite index, layers are read (and decoded) one at a time as the
// fusor asks for them, and new chunks are written back asynchronously so a
// miss never waits for the disk.
#pragma once

#include <memory>

#include "cache/chunk_store.h"
#include "cache/flash_store.h"

namespace cb::cache {

class FlashChunkStore final : public ChunkStore {
 public:
  explicit FlashChunkStore(std::shared_ptr<FlashStore> store) : store_(std::move(store)) {}
  std::unique_ptr<ChunkLayerSource> find(const ChunkKey& key, const KvShape& shape) override;
  // Queued for write-back; dropped (and counted in the store's stats) when
  // the queue is full, since the request already has the KV it needs.
  void put(const ChunkKey& key, ChunkKV kv) override;
  // Written now; kIo when it does not fit.
  void put_now(const ChunkKey& key, ChunkKV kv) override;
  // After the write-backs queued before it (one of them may be this key's),
  // the entry and its blob go (FlashStore::remove).
  bool remove(const ChunkKey& key) override {
    store_->flush();
    return store_->remove(key);
  }
  std::optional<ReadCounters> read_counters() const override {
    return store_->stats().read_counters();
  }
  FlashStore& store() { return *store_; }
  const FlashStore& store() const { return *store_; }

 private:
  std::shared_ptr<FlashStore> store_;
};

}  // namespace cb::cache
