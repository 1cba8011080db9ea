// The C API's shared machinery (api.h): the thread-local error message,
// handle liveness; and the version and error entry points.
#include "api.h"

#include <algorithm>
#include <limits>

#include "platform/thread_pool.h"
#include "platform/utf8.h"

#ifndef CB_PROJECT_VERSION
#error "CB_PROJECT_VERSION must be defined by the build"
#endif

static_assert(std::string_view(CB_PROJECT_VERSION) == CB_VERSION_STRING,
              "cacheblend.h CB_VERSION_* disagree with the project version in CMakeLists.txt");
static_assert(cb::ThreadPool::kMaxThreads == 512, "cacheblend.h and the messages say 512");

namespace cb::api {
namespace {

thread_local char g_last_error[1024] = "";

}  // namespace

// Messages quote names and strings from files (GGUF metadata, paths): they
// are stored as valid UTF-8 with control characters other than newline and
// tab (C0, DEL, C1) and invalid bytes written as \xNN, byte by byte, so
// printing one cannot drive a terminal or break a UTF-8 consumer.
// Cut at a whole character or escape when the buffer is full.
void set_message(std::string_view msg) noexcept {
  static const char kHex[] = "0123456789abcdef";
  const size_t cap = sizeof(g_last_error) - 1;
  size_t out = 0;
  for (size_t i = 0; i < msg.size();) {
    const unsigned char b = static_cast<unsigned char>(msg[i]);
    const Utf8Char c = utf8_char(msg, i);
    if ((c.valid && !is_control(c.cp)) || b == '\n' || b == '\t') {
      const size_t n = c.len;
      if (out + n > cap) break;
      std::memcpy(g_last_error + out, msg.data() + i, n);
      out += n;
      i += n;
    } else {
      if (out + 4 > cap) break;
      const char esc[4] = {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
      std::memcpy(g_last_error + out, esc, 4);
      out += 4;
      ++i;
    }
  }
  g_last_error[out] = '\0';
}

void clear_message() noexcept {
  g_last_error[0] = '\0';
}

const char* last_message() noexcept {
  return g_last_error;
}

cb_status from_code(cb::ErrorCode c) noexcept {
  switch (c) {
    case cb::ErrorCode::kInvalidArgument:
      return CB_ERR_INVALID_ARGUMENT;
    case cb::ErrorCode::kIo:
      return CB_ERR_IO;
    case cb::ErrorCode::kFormat:
      return CB_ERR_FORMAT;
    case cb::ErrorCode::kUnsupported:
      return CB_ERR_UNSUPPORTED;
    case cb::ErrorCode::kOutOfMemory:
      return CB_ERR_OUT_OF_MEMORY;
    case cb::ErrorCode::kContextOverflow:
      return CB_ERR_CONTEXT_OVERFLOW;
    case cb::ErrorCode::kCancelled:
      return CB_ERR_CANCELLED;
    case cb::ErrorCode::kInternal:
      return CB_ERR_INTERNAL;
  }
  return CB_ERR_INTERNAL;
}

cb_status fail_with(cb_status s, const char* fn, std::string_view what,
                    std::string_view prefix) noexcept {
  try {
    std::string m = std::string(fn) + ": " + std::string(prefix) + std::string(what);
    set_message(m);
  } catch (...) {
    set_message(what);
  }
  return s;
}

[[noreturn]] void invalid(const char* message) {
  throw ApiError{CB_ERR_INVALID_ARGUMENT, message};
}

void require(bool ok, const char* message) {
  if (!ok) invalid(message);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Copies bytes into a caller buffer with the size-query rule of the header.
cb_status write_text(std::string_view text, char* buf, size_t capacity, size_t* out_len) {
  *out_len = text.size();
  if (buf == nullptr && capacity == 0) return CB_OK;
  require(buf != nullptr, "buffer is NULL but capacity is not 0");
  if (capacity < text.size() + 1)
    throw ApiError{CB_ERR_BUFFER_TOO_SMALL,
                   "buffer too small (the size needed is in the length out-parameter, plus 1 for "
                   "the terminating NUL)"};
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  return CB_OK;
}

std::string basename_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

int32_t clamp_i32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

LiveHandles& live_handles() {
  // Never destroyed: an app may free handles from its own static destructors
  // or atexit handlers, which can run after ours would have.
  static LiveHandles* handles = new LiveHandles();
  return *handles;
}

bool is_live(const cb_model* m) {
  return m != nullptr && live_handles().contains(HandleKind::kModel, m);
}
bool is_live(const cb_session* s) {
  return s != nullptr && live_handles().contains(HandleKind::kSession, s);
}
bool is_live(const cb_chunk_cache* c) {
  return c != nullptr && live_handles().contains(HandleKind::kCache, c);
}

void check_model(const cb_model* m) {
  require(m != nullptr, "model is NULL");
  require(is_live(m), "model handle is not live (freed, or not a cb_model)");
}
void check_cache(const cb_chunk_cache* c) {
  require(c != nullptr, "cache is NULL");
  require(is_live(c), "cache handle is not live (freed, or not a cb_chunk_cache)");
}

const cb::Model& model_of(const cb_model* m) {
  check_model(m);
  return *m->state->model;
}

}  // namespace cb::api

// Version and errors.

using namespace cb::api;

extern "C" {

const char* cb_version(void) {
  return CB_VERSION_STRING;
}
int cb_version_number(void) {
  return CB_VERSION_NUMBER;
}

const char* cb_status_string(cb_status status) {
  switch (status) {
    case CB_OK:
      return "ok";
    case CB_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case CB_ERR_IO:
      return "input/output error";
    case CB_ERR_FORMAT:
      return "malformed file";
    case CB_ERR_UNSUPPORTED:
      return "unsupported";
    case CB_ERR_OUT_OF_MEMORY:
      return "out of memory";
    case CB_ERR_CONTEXT_OVERFLOW:
      return "context overflow";
    case CB_ERR_CANCELLED:
      return "cancelled";
    case CB_ERR_BUFFER_TOO_SMALL:
      return "buffer too small";
    case CB_ERR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

const char* cb_last_error(void) {
  return last_message();
}

}  // extern "C"
