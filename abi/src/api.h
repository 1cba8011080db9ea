// Internal to the C API (abi/src): the error machinery every entry point
// runs under (guard), the rules for option and output structs, the handle
// types and their liveness checks.  Not installed.  The C API is a thin
// layer over runtime/: it turns C calls into C++ calls and every exception
// into a status code plus a thread-local message; it computes nothing.
#pragma once

#include "cacheblend/cacheblend.h"

#include <cxxabi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "platform/error.h"
#include "runtime/blend/chunk_cache.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/session.h"

// The *_init of programs built before they became inline: still exported,
// each writing the size its struct had then.  The public header declares
// them only outside the library (CB_BUILDING_LIBRARY).
extern "C" {
CB_API void cb_model_options_init(cb_model_options* opts);
CB_API void cb_model_info_init(cb_model_info* info);
CB_API void cb_session_options_init(cb_session_options* opts);
CB_API void cb_sampling_options_init(cb_sampling_options* opts);
CB_API void cb_generate_options_init(cb_generate_options* opts);
CB_API void cb_generate_stats_init(cb_generate_stats* stats);
CB_API void cb_store_options_init(cb_store_options* opts);
CB_API void cb_chunk_cache_stats_init(cb_chunk_cache_stats* stats);
CB_API void cb_rag_options_init(cb_rag_options* opts);
CB_API void cb_rag_stats_init(cb_rag_stats* stats);
}

namespace cb::api {

// Thrown inside the C API only: a ready-made status + message.
struct ApiError {
  cb_status status;
  const char* message;
};

cb_status from_code(cb::ErrorCode c) noexcept;

// The calling thread's message for cb_last_error().
void set_message(std::string_view msg) noexcept;
void clear_message() noexcept;
const char* last_message() noexcept;

// Sets the message "<fn>: <prefix><what>" and returns `s`.
cb_status fail_with(cb_status s, const char* fn, std::string_view what,
                    std::string_view prefix = {}) noexcept;

// Runs `body` (which returns cb_status) with every exception mapped to a
// status and a message prefixed with the entry point's name.  The one
// exception let through is the forced unwinding of a thread that ends
// inside a callback (pthread_exit, thread cancellation; Python's shutdown
// ends its daemon threads so): it must reach the thread's start, and
// swallowing it aborts the process.  Its handler binds a reference to an
// exception object that is not a C++ object (null), which UBSan reports:
// UBSan is off for this function's own code (GCC ignores
// no_sanitize("null") here, and clang knows only no_sanitize("undefined"));
// `body` keeps its checks.
#if defined(__clang__)
#define CB_NO_UBSAN __attribute__((no_sanitize("undefined")))
#else
#define CB_NO_UBSAN __attribute__((no_sanitize_undefined))
#endif
template <class F>
CB_NO_UBSAN cb_status guard(const char* fn, F&& body) {
  clear_message();
  try {
    return body();
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (const ApiError& e) {
    return fail_with(e.status, fn, e.message);
  } catch (const cb::Error& e) {
    return fail_with(from_code(e.code()), fn, e.what());
  } catch (const std::bad_alloc&) {
    return fail_with(CB_ERR_OUT_OF_MEMORY, fn, "out of memory");
  } catch (const std::exception& e) {
    return fail_with(CB_ERR_INTERNAL, fn, e.what(), "internal error: ");
  } catch (...) {
    return fail_with(CB_ERR_INTERNAL, fn, "internal error: unknown exception");
  }
}

[[noreturn]] void invalid(const char* message);
void require(bool ok, const char* message);

// Options structs: struct_size must be one this library knows.  Version 1 of
// each struct is the current one; when a struct grows, its old size stays
// accepted and the fields it lacks keep their defaults.
template <class T>
T read_options(const T* user, void (*init)(T*, size_t), size_t min_size, const char* what) {
  T out;
  init(&out, sizeof(T));
  if (user == nullptr) return out;
  if (user->struct_size < min_size || user->struct_size > sizeof(T))
    throw ApiError{CB_ERR_INVALID_ARGUMENT, what};
  std::memcpy(static_cast<void*>(&out), user, user->struct_size);
  out.struct_size = sizeof(T);
  return out;
}

// What every cb_*_init_sized does: the first `size` bytes of `defaults`
// (all of it when the library's struct is shorter), struct_size set to
// their count.  Nothing when `user` is null or `size` cannot hold
// struct_size (a later call with the struct reports the size).
template <class T>
void write_defaults(T* user, const T& defaults, size_t size) {
  if (user == nullptr || size < sizeof(size_t)) return;
  T out = defaults;
  out.struct_size = size < sizeof(T) ? size : sizeof(T);
  std::memcpy(static_cast<void*>(user), &out, out.struct_size);
}

// write_defaults for a struct whose defaults are all zero (the stats and
// info structs, the session options).
template <class T>
void write_zeros(T* user, size_t size) {
  T zeros;
  std::memset(static_cast<void*>(&zeros), 0, sizeof(zeros));
  write_defaults(user, zeros, size);
}

// Output structs: same rule; returns how many bytes the caller's struct has.
template <class T>
size_t output_size(const T* user, size_t min_size, const char* what) {
  require(user != nullptr, what);
  if (user->struct_size < min_size || user->struct_size > sizeof(T))
    throw ApiError{CB_ERR_INVALID_ARGUMENT, what};
  return user->struct_size;
}

// The integer a caller stored in a C enum field.  C lets any int live there;
// in C++ loading an enum outside its range is undefined, so the bytes are
// read as an int and validated before they become an enum.
template <typename E>
int enum_value(const E& field) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

double ms_since(std::chrono::steady_clock::time_point t0);
// Copies bytes into a caller buffer with the size-query rule of the header.
cb_status write_text(std::string_view text, char* buf, size_t capacity, size_t* out_len);
std::string basename_of(const std::string& path);
int32_t clamp_i32(int64_t v);

// The shared part of a model handle: sessions hold it too, so the model
// outlives cb_model_free while sessions use it.
struct ModelState {
  std::unique_ptr<cb::Model> model;
  int32_t n_threads = 0;
  cb::BackendKind backend_kind = cb::BackendKind::kCpu;  // for every session of the model
  int device = 0;                                        // the CUDA device, on kCuda
  std::string name, architecture, backend, kernels;
};

}  // namespace cb::api

struct cb_model {
  std::shared_ptr<cb::api::ModelState> state;
};

struct cb_chunk_cache {
  std::unique_ptr<cb::ChunkCache> impl;
};

struct cb_session {
  std::shared_ptr<cb::api::ModelState> state;  // declared first: destroyed after `session`
  std::unique_ptr<cb::Session> session;
  std::unique_ptr<cb::Generator> generator;  // on `session`: the pending token, the last logits
  int32_t n_threads = 0;                     // as created (0: all cores); part of the device id
  // The thread inside a C API call on this session (SessionUse), if any.
  mutable std::atomic<std::thread::id> user{};
  // A cb_session_free from a callback of that call (token or abort
  // callback, on the same thread): the session stops its work and is
  // deleted when the call returns (SessionUse::release).
  bool free_requested = false;
};

namespace cb::api {

// Every handle the library has given out and not taken back, by type.  Entry
// points look a handle up here before touching it, so a freed handle, a
// second free, or a pointer that is not a handle of that type (another
// handle type cast, garbage) is refused instead of read.  Not detectable: a
// freed handle whose address the allocator gave to a new handle of the same
// type (the old pointer then names the new handle), and a free racing with
// another call on the same handle.
enum class HandleKind { kModel, kSession, kCache };

class LiveHandles {
 public:
  void add(HandleKind k, const void* p) {
    std::lock_guard lock(mu_);
    sets_[index(k)].insert(p);
  }
  // false: `p` was not live (already freed, or never a handle of this kind).
  bool remove(HandleKind k, const void* p) {
    std::lock_guard lock(mu_);
    return sets_[index(k)].erase(p) > 0;
  }
  bool contains(HandleKind k, const void* p) const {
    std::lock_guard lock(mu_);
    return sets_[index(k)].count(p) > 0;
  }

 private:
  static size_t index(HandleKind k) { return static_cast<size_t>(k); }
  mutable std::mutex mu_;
  std::unordered_set<const void*> sets_[3];
};

LiveHandles& live_handles();
bool is_live(const cb_model* m);
bool is_live(const cb_session* s);
bool is_live(const cb_chunk_cache* c);

// The handle checks of the entry points: NULL, not live, and (sessions) in
// use by the cb_generate whose token callback is calling.
void check_model(const cb_model* m);
void check_cache(const cb_chunk_cache* c);
const cb::Model& model_of(const cb_model* m);

// One C API call's claim on a session.  Calls on one session must be
// serialized by the caller; a second thread, or a callback calling back
// into its session, is told so instead of racing.
class SessionUse {
 public:
  explicit SessionUse(const cb_session* s) {
    require(s != nullptr, "session is NULL");
    require(is_live(s), "session handle is not live (freed, or not a cb_session)");
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id none{};
    if (!s->user.compare_exchange_strong(none, me, std::memory_order_acquire)) {
      require(none != me,
              "the session is inside a call: its callbacks must not call into the same session");
      require(false,
              "the session is in use by another thread (calls on one session must be "
              "serialized by the caller)");
    }
    s_ = s;
  }
  ~SessionUse() { release(); }
  SessionUse(const SessionUse&) = delete;
  SessionUse& operator=(const SessionUse&) = delete;
  // Ends the claim; deletes the session when a callback freed it meanwhile.
  void release() {
    if (s_ == nullptr) return;
    s_->user.store(std::thread::id{}, std::memory_order_release);
    if (s_->free_requested) delete s_;
    s_ = nullptr;
  }

 private:
  const cb_session* s_ = nullptr;
};

}  // namespace cb::api
