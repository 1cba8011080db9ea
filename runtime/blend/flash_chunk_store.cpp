#include "runtime/blend/flash_chunk_store.h"

namespace cb {
namespace {

class FlashChunkSource final : public ChunkLayerSource {
 public:
  FlashChunkSource(std::shared_ptr<cache::FlashStore> store, cache::ChunkHandle handle)
      : store_(std::move(store)), handle_(std::move(handle)) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    // A corrupt or truncated segment is dropped by the store and reported as
    // false: the fusor then computes the chunk instead.
    return layer < handle_.n_layers() &&
           store_->fetch_layer(handle_, static_cast<int>(layer), k, v);
  }
  uint64_t layer_bytes(int64_t layer) const override {
    return layer >= 0 && layer < handle_.n_layers() ? handle_.layer_bytes(static_cast<int>(layer))
                                                    : 0;
  }
  std::optional<cache::Codec> codec() const override { return handle_.codec(); }
  std::optional<cache::KvShape> shape() const override { return handle_.shape(); }

 private:
  std::shared_ptr<cache::FlashStore> store_;
  cache::ChunkHandle handle_;
};

}  // namespace

std::unique_ptr<ChunkLayerSource> FlashChunkStore::find(const cache::ChunkKey& key) {
  std::optional<cache::ChunkHandle> h = store_->lookup(key);
  if (!h) return nullptr;
  return std::make_unique<FlashChunkSource>(store_, std::move(*h));
}

void FlashChunkStore::put(const cache::ChunkKey& key, cache::ChunkKV kv) {
  store_->put_async(key, std::move(kv));
}

}  // namespace cb
