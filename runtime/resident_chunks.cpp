#include "runtime/resident_chunks.h"

#include "platform/error.h"

namespace cb {

ResidentChunks::ResidentChunks(Backend& be, int64_t n_layer, int64_t kv_dim, size_t v_elem,
                               uint64_t budget_bytes)
    : be_(be), n_layer_(n_layer), kv_dim_(kv_dim), v_elem_(v_elem), budget_(budget_bytes) {}

ResidentChunks::~ResidentChunks() {
  clear();
}

void ResidentChunks::begin_request() {
  ++request_;
}

ResidentChunk* ResidentChunks::acquire(const std::string& name, int64_t n_tokens) {
  if (budget_ == 0 || n_tokens <= 0) return nullptr;
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    ResidentChunk& e = it->second;
    if (e.n_tokens != n_tokens) {
      // A name reused for other bytes: they are not these.  Freed unless
      // this request holds the entry.
      if (e.last_use == request_) return nullptr;
      release(it);
    } else {
      if (e.last_use == request_ && !e.ready) return nullptr;
      e.last_use = request_;
      return &e;
    }
  }
  const size_t row = static_cast<size_t>(n_tokens * kv_dim_);
  const size_t k_bytes = row * sizeof(float);
  const size_t layer_bytes = (k_bytes + row * v_elem_ + 63) / 64 * 64;
  const size_t bytes = layer_bytes * static_cast<size_t>(n_layer_);
  if (bytes > budget_) return nullptr;
  while (bytes_ + bytes > budget_) {
    auto oldest = entries_.end();
    for (auto e = entries_.begin(); e != entries_.end(); ++e)
      if (e->second.last_use != request_ &&
          (oldest == entries_.end() || e->second.last_use < oldest->second.last_use))
        oldest = e;
    if (oldest == entries_.end()) return nullptr;  // all in use by this request
    release(oldest);
  }
  void* base = nullptr;
  try {
    base = be_.alloc_buffer(bytes);
  } catch (const Error& e) {
    // No memory for it: the request loads the chunk from its store as
    // without an entry.
    if (e.code() == ErrorCode::kOutOfMemory) return nullptr;
    throw;
  }
  ResidentChunk& e = entries_[name];
  e.n_tokens = n_tokens;
  e.base = static_cast<char*>(base);
  e.k_bytes = k_bytes;
  e.layer_bytes = layer_bytes;
  e.bytes = bytes;
  e.last_use = request_;
  bytes_ += bytes;
  return &e;
}

void ResidentChunks::clear() {
  while (!entries_.empty()) release(entries_.begin());
}

void ResidentChunks::release(std::map<std::string, ResidentChunk>::iterator it) {
  be_.free_buffer(it->second.base);
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

}  // namespace cb
