// Aligned blocks for the backends' large buffers (activations, KV caches,
// key transposes), from mimalloc: the one place the runtime names its
// allocator, so that mimalloc stays a private dependency of this library.
#pragma once

#include <cstddef>

namespace cb {

// `bytes` (at least 1 byte is allocated for 0) aligned to `alignment`, a
// power of two; nullptr when memory is exhausted.
void* allocate_aligned(size_t bytes, size_t alignment);
// A block from allocate_aligned, or nullptr.
void free_aligned(void* p);

}  // namespace cb
