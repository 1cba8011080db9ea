// Owning wrappers of the C API's handles for the samples: each frees its
// handle once, on destruction; none can be copied.  Fill the pointer with
// the matching create/load/open call.
#pragma once

#include "cacheblend/cacheblend.h"

namespace cbs {

template <class T, void (*Free)(T*)>
struct Handle {
  T* h = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  // Frees the handle now (a later destruction does nothing).
  void reset() {
    Free(h);
    h = nullptr;
  }
};

using ModelHandle = Handle<cb_model, cb_model_free>;
using SessionHandle = Handle<cb_session, cb_session_free>;
using ChunkCacheHandle = Handle<cb_chunk_cache, cb_chunk_cache_free>;

}  // namespace cbs
