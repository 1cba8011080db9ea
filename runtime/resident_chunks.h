// Retrieved chunks' KV kept in backend memory between requests, so that a
// request whose chunks an earlier one loaded copies them within the backend
// (a discrete GPU: device to device) instead of reading the chunk store and
// crossing the bus again.  A session owns one (Session::resident_chunks());
// the CacheBlend loader (runtime/blend/layer_pipeline.h) fills and reads it.
//
// An entry holds, per layer, a chunk's K as its source gives it (f32, before
// RoPE) and its V as the session's KV cache stores it (f32 or f16): the
// bytes the loader would otherwise stage and upload for that chunk.  So a
// load from an entry is bitwise a load from the source it was recorded from.
// Entries are named by the caller, which names what makes the bytes (the
// store, the chunk's key, the codec it was read in); the first request that
// loads a chunk records it, and the entry is ready once every layer was
// recorded by a load that completed.
//
// Least recently used entries go first when the byte budget is full, never
// one the current request (since begin_request()) acquired.  Not
// thread-safe: the compute thread acquires entries between requests; while
// a request loads, the loader's threads only copy into and out of entries'
// memory through Backend::upload and mark entries ready.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "kernels/backend.h"

namespace cb {

struct ResidentChunk {
  int64_t n_tokens = 0;
  // Set by the loader once every layer's K and V are in the entry.
  bool ready = false;
  float* k(int64_t layer) const { return reinterpret_cast<float*>(at(layer)); }
  void* v(int64_t layer) const { return at(layer) + k_bytes; }

 private:
  friend class ResidentChunks;
  char* at(int64_t layer) const { return base + static_cast<size_t>(layer) * layer_bytes; }
  char* base = nullptr;
  size_t k_bytes = 0, layer_bytes = 0, bytes = 0;
  uint64_t last_use = 0;  // the request that last acquired it
};

class ResidentChunks {
 public:
  // Entries of n_layer layers of kv_dim-wide rows, V in v_elem bytes an
  // element, within budget_bytes of `be`'s memory (0: none are kept).
  ResidentChunks(Backend& be, int64_t n_layer, int64_t kv_dim, size_t v_elem,
                 uint64_t budget_bytes);
  ~ResidentChunks();
  ResidentChunks(const ResidentChunks&) = delete;
  ResidentChunks& operator=(const ResidentChunks&) = delete;

  // Starts a request: what it acquires is kept until the next one starts.
  void begin_request();
  // The entry named `name` for a chunk of n_tokens: ready to load from, or
  // to be recorded (not ready), evicting older entries to make room.  Null
  // when the budget cannot hold it, the backend has no memory left for it,
  // or the request already acquired it and it is being recorded (one
  // recording at a time) or holds other bytes (another n_tokens).
  ResidentChunk* acquire(const std::string& name, int64_t n_tokens);
  // Frees every entry.
  void clear();

  uint64_t budget_bytes() const { return budget_; }
  uint64_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }

 private:
  void release(std::map<std::string, ResidentChunk>::iterator it);

  Backend& be_;
  int64_t n_layer_, kv_dim_;
  size_t v_elem_;
  uint64_t budget_;
  uint64_t bytes_ = 0;
  uint64_t request_ = 0;
  std::map<std::string, ResidentChunk> entries_;
};

}  // namespace cb
