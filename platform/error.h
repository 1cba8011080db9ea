// One exception type for the whole runtime.  Internals throw cb::Error; the C
// ABI (abi/) catches everything and turns it into a status code plus message,
// so no exception ever crosses the C boundary.
#pragma once

#include <stdexcept>
#include <string>

namespace cb {

enum class ErrorCode {
  kInvalidArgument,  // caller passed something unusable
  kIo,               // open/read/write/mmap failed
  kFormat,           // malformed file (GGUF, cache blob)
  kUnsupported,      // well-formed but not supported (tensor type, architecture)
  kOutOfMemory,      // allocation refused
  kContextOverflow,  // prompt or request longer than the context
  kCancelled,        // caller asked to stop
  kInternal,         // a bug: an invariant did not hold
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

[[noreturn]] inline void fail(ErrorCode code, const std::string& message) {
  throw Error(code, message);
}

}  // namespace cb
