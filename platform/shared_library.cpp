#include "platform/shared_library.h"

#include <dlfcn.h>

namespace cb {

void* open_shared_library(const std::string& path, std::string* error) {
  // RTLD_LOCAL: the library's symbols stay its own (it exports one entry
  // point, looked up with shared_library_symbol).
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : path + ": cannot be loaded";
  }
  return library;
}

void* shared_library_symbol(void* library, const char* name) {
  return library != nullptr ? dlsym(library, name) : nullptr;
}

std::string directory_of_code(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return {};
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash);
}

}  // namespace cb
