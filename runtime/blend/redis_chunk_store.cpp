#include "runtime/blend/redis_chunk_store.h"

#include "platform/error.h"

namespace cb {
namespace {

class RedisChunkSource final : public ChunkLayerSource {
 public:
  RedisChunkSource(std::shared_ptr<cache::RedisStore> store, cache::RedisChunkHandle handle)
      : store_(std::move(store)), handle_(std::move(handle)) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    // Unreachable, evicted or corrupt: false, and the fusor computes the
    // chunk instead.
    return layer >= 0 && layer < handle_.n_layers() &&
           store_->fetch_layer(handle_, static_cast<int>(layer), k, v);
  }
  uint64_t layer_bytes(int64_t layer) const override {
    return layer >= 0 && layer < handle_.n_layers() ? handle_.layer_bytes(static_cast<int>(layer))
                                                    : 0;
  }
  std::optional<cache::Codec> codec() const override { return handle_.codec(); }
  std::optional<cache::KvShape> shape() const override { return handle_.shape(); }

 private:
  std::shared_ptr<cache::RedisStore> store_;
  cache::RedisChunkHandle handle_;
};

}  // namespace

[[noreturn]] void RedisChunkStore::unreachable() const {
  fail(ErrorCode::kIo, "redis server unreachable: " + store_->stats().last_error);
}

std::unique_ptr<ChunkLayerSource> RedisChunkStore::find(const cache::ChunkKey& key) {
  std::optional<cache::RedisChunkHandle> h = store_->lookup(key);
  if (!h) {
    if (!store_->reachable()) unreachable();
    return nullptr;
  }
  return std::make_unique<RedisChunkSource>(store_, std::move(*h));
}

void RedisChunkStore::put(const cache::ChunkKey& key, cache::ChunkKV kv) {
  // Known down: refused here, so a tiered store keeps the chunk elsewhere.
  if (!store_->reachable() && !store_->ping()) unreachable();
  if (!store_->put_async(key, std::move(kv)))
    fail(ErrorCode::kIo, "redis write-back queue full: chunk not stored");
}

}  // namespace cb
