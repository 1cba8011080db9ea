// The assistant's user-facing failure, apart from app.h so that the parts
// that need no model (the corpus database, retrieval) need no C API either.
#pragma once

#include <stdexcept>

namespace rag {

// A user-facing failure: main() prints "rag_assistant: error: MESSAGE" and
// exits with status 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace rag
