// Loading a shared library at run time (dlopen), for optional parts such as
// the CUDA backend that must not be link-time dependencies of the core.
#pragma once

#include <string>

namespace cb {

// Opens `path` (a bare file name goes through the system search:
// LD_LIBRARY_PATH, the caller's RUNPATH, the ld.so cache).  Returns the
// handle, or nullptr with the loader's reason in *error.  The library is
// never unloaded: its code (vtables, deleters) may be in use until exit.
void* open_shared_library(const std::string& path, std::string* error);

// The address of `name` in a library from open_shared_library(), or nullptr.
void* shared_library_symbol(void* library, const char* name);

// The directory of the executable or shared library that holds `address`,
// or "" when the loader cannot tell.
std::string directory_of_code(const void* address);

}  // namespace cb
