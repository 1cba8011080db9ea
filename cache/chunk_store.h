// The chunk store: where chunk KV is found by key and new chunk KV is kept,
// the one interface a RAG request reads and writes chunks through.
// RamChunkStore keeps entries in RAM; FlashChunkStore
// (flash_chunk_store.h) keeps them compressed on flash in FlashStore.
// A ChunkCache (runtime/blend/chunk_cache.h, the C API's cb_chunk_cache)
// owns one of them.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "cache/chunk_kv.h"
#include "cache/chunk_source.h"
#include "cache/codec.h"

namespace cb::cache {

class ChunkStore {
 public:
  ChunkStore() : id_(next_id()) {}
  virtual ~ChunkStore() = default;
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;
  // This store object's number, never reused in the process: with a key
  // and a codec it names the bytes a chunk is read as (a copy of them kept
  // elsewhere, such as a session's resident chunks, is named so).
  uint64_t id() const { return id_; }
  // A reader of the chunk's layers, or null on a miss.  The reader stays
  // valid even if the entry is evicted meanwhile.  `shape` is what the
  // chunk's model and tokens make its KV (chunk_kv_shape): an entry of any
  // other shape is a miss, so a reader never writes more rows than the
  // caller holds and nothing is sized from what a store says.
  virtual std::unique_ptr<ChunkLayerSource> find(const ChunkKey& key, const KvShape& shape) = 0;
  // Keeps the chunk; a store that writes back asynchronously may still
  // lose it (a full queue, a refusing server), counted in its stats.
  virtual void put(const ChunkKey& key, ChunkKV kv) = 0;
  // Keeps the chunk before returning, or throws cb::Error (kIo) saying why
  // not: for an ingest step, which reports the chunk stored.
  virtual void put_now(const ChunkKey& key, ChunkKV kv) { put(key, std::move(kv)); }
  // Drops the entry, if any (readers already handed out stay valid).
  // false: there was none.
  virtual bool remove(const ChunkKey& key) = 0;
  // What a store that reads from storage has read (bytes, time, decoding),
  // which the loading controller learns read speed from; none for a store
  // in RAM.
  virtual std::optional<ReadCounters> read_counters() const { return std::nullopt; }

 private:
  static uint64_t next_id() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }
  const uint64_t id_;
};

// Chunk KV in RAM, exact (f32).  Thread-safe.
class RamChunkStore final : public ChunkStore {
 public:
  std::unique_ptr<ChunkLayerSource> find(const ChunkKey& key, const KvShape& shape) override;
  void put(const ChunkKey& key, ChunkKV kv) override;
  bool remove(const ChunkKey& key) override;
  size_t size() const;
  size_t bytes() const;
  void clear();

 private:
  mutable std::mutex mu_;
  // Keyed by every field of the key, serialized: no hash collisions.
  std::unordered_map<std::string, std::shared_ptr<const ChunkKV>> entries_;
  size_t bytes_ = 0;
};

}  // namespace cb::cache
