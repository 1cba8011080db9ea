#include "platform/aligned_memory.h"

#include <mimalloc.h>

namespace cb {

void* allocate_aligned(size_t bytes, size_t alignment) {
  return mi_malloc_aligned(bytes == 0 ? 1 : bytes, alignment);
}

void free_aligned(void* p) {
  mi_free(p);
}

}  // namespace cb
