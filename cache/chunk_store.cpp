#include "cache/chunk_store.h"

namespace cb::cache {
namespace {

// Keeps the entry alive while a request reads it.
class SharedChunkSource final : public ChunkLayerSource {
 public:
  explicit SharedChunkSource(std::shared_ptr<const ChunkKV> kv)
      : kv_(std::move(kv)), reader_(*kv_) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    return reader_.fetch_layer(layer, k, v);
  }
  uint64_t layer_bytes(int64_t layer) const override { return reader_.layer_bytes(layer); }
  std::optional<KvShape> shape() const override { return kv_->shape; }

 private:
  std::shared_ptr<const ChunkKV> kv_;
  MemoryChunkSource reader_;
};

}  // namespace

std::unique_ptr<ChunkLayerSource> RamChunkStore::find(const ChunkKey& key, const KvShape& shape) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(serialize_key(key));
  if (it == entries_.end() || !(it->second->shape == shape)) return nullptr;
  return std::make_unique<SharedChunkSource>(it->second);
}

void RamChunkStore::put(const ChunkKey& key, ChunkKV kv) {
  auto entry = std::make_shared<const ChunkKV>(std::move(kv));
  const size_t n = (entry->k.size() + entry->v.size()) * sizeof(float);
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.try_emplace(serialize_key(key), entry);
  if (!inserted) {
    bytes_ -= (it->second->k.size() + it->second->v.size()) * sizeof(float);
    it->second = entry;
  }
  bytes_ += n;
}

bool RamChunkStore::remove(const ChunkKey& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(serialize_key(key));
  if (it == entries_.end()) return false;
  bytes_ -= (it->second->k.size() + it->second->v.size()) * sizeof(float);
  entries_.erase(it);
  return true;
}

size_t RamChunkStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

size_t RamChunkStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

void RamChunkStore::clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
  bytes_ = 0;
}

}  // namespace cb::cache
