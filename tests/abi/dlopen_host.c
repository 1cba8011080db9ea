/* A host that loads libcacheblend.so at run time before anything else in
 * the process uses the C++ runtime (as Python's ctypes does), then loads a
 * C++ library that allocates with new and frees with delete.  Debian's
 * libmimalloc.so defines operator new and delete too: if libstdc++ bound its
 * own calls to them when libcacheblend.so brought both in, the library
 * allocated with glibc's malloc and freed with mimalloc's free, and crashed.
 *
 *   dlopen_host LIBCACHEBLEND CXX_PROBE */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  void* cb;
  void* probe;
  int (*churn)(int);
  if (argc != 3) {
    fprintf(stderr, "usage: dlopen_host LIBCACHEBLEND CXX_PROBE\n");
    return 2;
  }
  cb = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (cb == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  probe = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (probe == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
    return 1;
  }
  *(void**)(&churn) = dlsym(probe, "cxx_probe_churn");
  if (churn == NULL) {
    fprintf(stderr, "no cxx_probe_churn in %s\n", argv[2]);
    return 1;
  }
  if (churn(10000) != 10000) {
    fprintf(stderr, "cxx_probe_churn miscounted\n");
    return 1;
  }
  printf("ok: a C++ library loaded after libcacheblend.so allocates and frees\n");
  return 0;
}
