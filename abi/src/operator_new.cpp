// libcacheblend.so's own operator new (local to the library: the version
// script exports cb_* only).  Where a host binds mimalloc's operator new
// rather than libstdc++'s (mimalloc preloaded, or linked ahead of the C++
// runtime), running out of memory called abort(): mimalloc's throwing new
// throws only through a new-handler it cannot see.  Here every throwing new
// of the library takes the host's nothrow new (libstdc++'s or mimalloc's,
// each paired with the host's operator delete) and throws std::bad_alloc
// itself, which the C API reports as CB_ERR_OUT_OF_MEMORY.  Only in the
// shared library: in a program linked with the static archive, this would
// be the program's operator new, and libstdc++'s nothrow new calls that.
#include <cstddef>
#include <new>

namespace {

void* allocate(std::size_t n) {
  if (void* p = ::operator new(n, std::nothrow)) return p;
  throw std::bad_alloc();
}

void* allocate(std::size_t n, std::align_val_t a) {
  if (void* p = ::operator new(n, a, std::nothrow)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t n) {
  return allocate(n);
}
void* operator new[](std::size_t n) {
  return allocate(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate(n, a);
}
