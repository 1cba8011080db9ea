// The C API: a thin layer over runtime/ that turns C calls into C++ calls and
// every exception into a status code plus a thread-local message.  Nothing
// here computes anything itself.
#include "cacheblend/cacheblend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "platform/error.h"
#include "platform/thread_pool.h"
#include "runtime/blend/blend_options.h"
#include "runtime/blend/calibration.h"
#include "runtime/blend/chunk_table.h"
#include "runtime/blend/flash_chunk_store.h"
#include "runtime/blend/loading_controller.h"
#include "runtime/blend/rag_request.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/stop_strings.h"
#include "runtime/tokenizer/tokenizer.h"

#ifndef CB_PROJECT_VERSION
#error "CB_PROJECT_VERSION must be defined by the build"
#endif

static_assert(std::string_view(CB_PROJECT_VERSION) == CB_VERSION_STRING,
              "cacheblend.h CB_VERSION_* disagree with the project version in CMakeLists.txt");
static_assert(cb::ThreadPool::kMaxThreads == 512, "cacheblend.h and the messages say 512");

namespace {

// ---------------------------------------------------------------------------
// Errors

thread_local char g_last_error[1024] = "";

// The length of the well-formed UTF-8 sequence at msg[i] (2-4 bytes, no
// overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t utf8_sequence(std::string_view msg, size_t i) noexcept {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(msg[i + k]); };
  const unsigned char b = at(0);
  size_t len = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
  }
  if (len == 0 || i + len > msg.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((at(k) & 0xC0) != 0x80) return 0;
  if ((b == 0xE0 && at(1) < 0xA0) || (b == 0xED && at(1) > 0x9F) || (b == 0xF0 && at(1) < 0x90) ||
      (b == 0xF4 && at(1) > 0x8F))
    return 0;
  return len;
}

// Messages quote names and strings from files (GGUF metadata, paths): they
// are stored as valid UTF-8 with control bytes and invalid bytes written as
// \xNN, so printing one cannot drive a terminal or break a UTF-8 consumer.
// Cut at a whole character or escape when the buffer is full.
void set_message(std::string_view msg) noexcept {
  static const char kHex[] = "0123456789abcdef";
  const size_t cap = sizeof(g_last_error) - 1;
  size_t out = 0;
  for (size_t i = 0; i < msg.size();) {
    const unsigned char b = static_cast<unsigned char>(msg[i]);
    const size_t seq = b >= 0x80 ? utf8_sequence(msg, i) : 0;
    if (seq > 0 || (b >= 0x20 && b < 0x7F) || b == '\n' || b == '\t') {
      const size_t n = seq > 0 ? seq : 1;
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

// Thrown inside this file only: a ready-made status + message.
struct ApiError {
  cb_status status;
  const char* message;
};

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
                    std::string_view prefix = {}) noexcept {
  try {
    std::string m = std::string(fn) + ": " + std::string(prefix) + std::string(what);
    set_message(m);
  } catch (...) {
    set_message(what);
  }
  return s;
}

// Runs `body` (which returns cb_status) with every exception mapped to a
// status and a message prefixed with the entry point's name.
template <class F>
cb_status guard(const char* fn, F&& body) noexcept {
  g_last_error[0] = '\0';
  try {
    return body();
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

[[noreturn]] void invalid(const char* message) {
  throw ApiError{CB_ERR_INVALID_ARGUMENT, message};
}

void require(bool ok, const char* message) {
  if (!ok) invalid(message);
}

// Options structs: struct_size must be one this library knows.  Version 1 of
// each struct is the current one; when a struct grows, its old size stays
// accepted and the fields it lacks keep their defaults.
template <class T>
T read_options(const T* user, void (*init)(T*), size_t min_size, const char* what) {
  T out;
  init(&out);
  if (user == nullptr) return out;
  if (user->struct_size < min_size || user->struct_size > sizeof(T))
    throw ApiError{CB_ERR_INVALID_ARGUMENT, what};
  std::memcpy(static_cast<void*>(&out), user, user->struct_size);
  out.struct_size = sizeof(T);
  return out;
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

// The shared part of a model handle: sessions hold it too, so the model
// outlives cb_model_free while sessions use it.
struct ModelState {
  std::unique_ptr<cb::Model> model;
  int32_t n_threads = 0;
  cb::BackendKind backend_kind = cb::BackendKind::kCpu;  // for every session of the model
  int device = 0;                                        // the CUDA device, on kCuda
  std::string name, architecture, backend, kernels;
};

}  // namespace

struct cb_model {
  std::shared_ptr<ModelState> state;
};

struct cb_chunk_cache {
  cb::MemoryChunkTable table;                  // chunks in RAM, unless ...
  std::unique_ptr<cb::FlashChunkStore> flash;  // ... the cache lives on flash
  cb::ChunkKvStore& kv() { return flash ? static_cast<cb::ChunkKvStore&>(*flash) : table; }

  // Auto ratio (flash only): calibration saved beside the store, one
  // controller per (device, model), created at first use.
  std::mutex auto_mu;
  std::unique_ptr<cb::CalibrationDb> calibration_db;
  std::map<std::string, std::unique_ptr<cb::LoadingController>> controllers;
  double assumed_read_bytes_per_sec = 0.0;  // cb_store_options: 0 = measure
};

struct cb_session {
  std::shared_ptr<ModelState> state;  // declared first: destroyed after `session`
  std::unique_ptr<cb::Session> session;
  std::unique_ptr<cb::Generator> generator;  // on `session`: the pending token, the last logits
  int32_t n_threads = 0;                     // as created (0: all cores); part of the device id
  // Inside cb_generate: a cb_session_free from the token callback is carried
  // out when cb_generate returns.
  bool generating = false;
  // The thread inside a C API call on this session (SessionUse), if any.
  mutable std::atomic<std::thread::id> user{};
  bool free_requested = false;
};

namespace {

// ---------------------------------------------------------------------------
// Live handles

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

// The handle checks of the entry points: NULL, not live, and (sessions) in
// use by the cb_generate whose token callback is calling.
void check_model(const cb_model* m) {
  require(m != nullptr, "model is NULL");
  require(is_live(m), "model handle is not live (freed, or not a cb_model)");
}
// One C API call's claim on a session.  Calls on one session must be
// serialized by the caller; a second thread, or a token callback calling
// back into its session, is told so instead of racing.
class SessionUse {
 public:
  explicit SessionUse(const cb_session* s) {
    require(s != nullptr, "session is NULL");
    require(is_live(s), "session handle is not live (freed, or not a cb_session)");
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id none{};
    if (!s->user.compare_exchange_strong(none, me, std::memory_order_acquire)) {
      require(none != me,
              "the session is generating: its token callback must not call into the same session");
      require(false,
              "the session is in use by another thread (calls on one session must be "
              "serialized by the caller)");
    }
    s_ = s;
  }
  ~SessionUse() { release(); }
  SessionUse(const SessionUse&) = delete;
  SessionUse& operator=(const SessionUse&) = delete;
  void release() {
    if (s_) s_->user.store(std::thread::id{}, std::memory_order_release);
    s_ = nullptr;
  }

 private:
  const cb_session* s_ = nullptr;
};
void check_cache(const cb_chunk_cache* c) {
  require(c != nullptr, "cache is NULL");
  require(is_live(c), "cache handle is not live (freed, or not a cb_chunk_cache)");
}

const cb::Model& model_of(const cb_model* m) {
  check_model(m);
  return *m->state->model;
}

cb_stop_reason stop_reason_of(cb::StopReason r) {
  switch (r) {
    case cb::StopReason::kNone:
      return CB_STOP_NONE;
    case cb::StopReason::kEndOfGeneration:
      return CB_STOP_END_OF_GENERATION;
    case cb::StopReason::kMaxTokens:
      return CB_STOP_MAX_TOKENS;
    case cb::StopReason::kContextFull:
      return CB_STOP_CONTEXT_FULL;
    case cb::StopReason::kStopString:
      return CB_STOP_STRING;
    case cb::StopReason::kCancelled:
      return CB_STOP_CANCELLED;
  }
  return CB_STOP_NONE;
}

// The fields of cb_rag_options that decide a chunk's cache key.  One parser
// for cb_rag_prefill, cb_chunk_cache_add and cb_chunk_cache_contains, so an
// ingest step and a later request always agree on the key.
struct ChunkKeyOptions {
  cb::ChunkHead head = cb::ChunkHead::kPrompt;
  std::string system_prompt;
  std::string ns;
};

constexpr const char* kDefaultSystemPrompt = "Answer the question using the documents.";

ChunkKeyOptions chunk_key_options(const cb_rag_options& o) {
  ChunkKeyOptions k;
  switch (enum_value(o.chunk_head)) {
    case CB_CHUNK_HEAD_PROMPT:
      k.head = cb::ChunkHead::kPrompt;
      break;
    case CB_CHUNK_HEAD_NONE:
      k.head = cb::ChunkHead::kNone;
      break;
    default:
      invalid("unknown chunk_head value (use a cb_chunk_head)");
  }
  k.system_prompt = o.system_prompt != nullptr ? o.system_prompt : kDefaultSystemPrompt;
  if (o.cache_namespace != nullptr) k.ns = o.cache_namespace;
  return k;
}

cb_rag_options read_rag_options(const cb_rag_options* opts) {
  return read_options(opts, cb_rag_options_init, offsetof(cb_rag_options, select),
                      "cb_rag_options.struct_size is not a known size (use cb_rag_options_init)");
}

// A chunk as cb_rag_prefill would see it: its tokens, the tokens its KV is
// computed after, and its cache key.
struct ChunkEntry {
  std::vector<int32_t> tokens;
  std::vector<int32_t> head;
  cb::cache::ChunkKey key;
};

ChunkEntry chunk_entry(const cb::Model& model, const char* chunk_text, const cb_rag_options* opts) {
  const ChunkKeyOptions ko = chunk_key_options(read_rag_options(opts));
  ChunkEntry e;
  e.tokens = cb::rag_chunk_tokens(model.tokenizer(), chunk_text);
  e.head = cb::chunk_head_tokens(ko.head, cb::rag_prompt_head(model.tokenizer(), ko.system_prompt));
  e.key = cb::chunk_cache_key(model, ko.head, e.head, e.tokens, ko.ns);
  return e;
}

}  // namespace

// ---------------------------------------------------------------------------
// Version and errors

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
  return g_last_error;
}

// ---------------------------------------------------------------------------
// Model

void cb_model_options_init(cb_model_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->n_threads = 0;
  opts->backend = CB_BACKEND_AUTO;
}

cb_status cb_model_load(const char* path, const cb_model_options* opts, cb_model** out_model) {
  return guard("cb_model_load", [&] {
    require(out_model != nullptr, "out_model is NULL");
    require(path != nullptr, "path is NULL");
    require(path[0] != '\0', "path is empty");
    // Callers built before `device` existed pass a smaller struct: still
    // valid, device 0.
    const cb_model_options o = read_options(
        opts, cb_model_options_init, offsetof(cb_model_options, device),
        "cb_model_options.struct_size is not a known size (use cb_model_options_init)");
    require(o.n_threads >= 0 && o.n_threads <= cb::ThreadPool::kMaxThreads,
            "n_threads must be in [0, 512]");
    require(o.device >= 0, "device must be >= 0");
    cb::BackendRequest request = cb::BackendRequest::kAuto;
    switch (enum_value(o.backend)) {
      case CB_BACKEND_AUTO:
        break;
      case CB_BACKEND_CPU:
        request = cb::BackendRequest::kCpu;
        break;
      case CB_BACKEND_CUDA:
        request = cb::BackendRequest::kCuda;
        break;
      default:
        invalid("unknown backend value");
    }
    cb::BackendKind kind;
    try {
      kind = cb::resolve_backend(request, o.device);
    } catch (const cb::Error& e) {
      throw cb::Error(e.code(), std::string("CB_BACKEND_CUDA: ") + e.what() +
                                    "; use CB_BACKEND_CPU or CB_BACKEND_AUTO");
    }
    auto state = std::make_shared<ModelState>();
    state->model = cb::Model::load(path);
    state->n_threads = o.n_threads;
    state->name = state->model->name().empty() ? basename_of(path) : state->model->name();
    state->architecture =
        state->model->gguf().get_string("general.architecture").value_or(std::string("llama"));
    state->backend_kind = kind;
    state->device = kind == cb::BackendKind::kCuda ? o.device : 0;
    state->backend = kind == cb::BackendKind::kCuda ? "cuda" : "cpu";
    state->kernels = kind == cb::BackendKind::kCuda ? "cuda" : cb::cpu_kernel_level_name();
    auto handle = std::make_unique<cb_model>();
    handle->state = std::move(state);
    live_handles().add(HandleKind::kModel, handle.get());
    *out_model = handle.release();
    return CB_OK;
  });
}

void cb_model_free(cb_model* model) {
  // A handle that is not live (a second free, not a model) is ignored: it
  // must not be touched.  Sessions keep the model's state alive.
  if (model == nullptr || !live_handles().remove(HandleKind::kModel, model)) return;
  delete model;
}

void cb_model_info_init(cb_model_info* info) {
  if (info == nullptr) return;
  std::memset(static_cast<void*>(info), 0, sizeof(*info));
  info->struct_size = sizeof(*info);
}

cb_status cb_model_get_info(const cb_model* model, cb_model_info* info) {
  return guard("cb_model_get_info", [&] {
    const cb::Model& m = model_of(model);
    const size_t size = output_size(
        info, sizeof(cb_model_info),
        "info is NULL or info->struct_size is not a known size (use cb_model_info_init)");
    const cb::LlamaHparams& hp = m.hparams();
    const ModelState& st = *model->state;
    cb_model_info out;
    cb_model_info_init(&out);
    out.n_layer = clamp_i32(hp.n_layer);
    out.n_embd = clamp_i32(hp.n_embd);
    out.n_head = clamp_i32(hp.n_head);
    out.n_head_kv = clamp_i32(hp.n_head_kv);
    out.head_dim = clamp_i32(hp.head_dim);
    out.n_ff = clamp_i32(hp.n_ff);
    out.n_vocab = clamp_i32(hp.n_vocab);
    out.n_ctx_train = clamp_i32(hp.n_ctx_train);
    out.file_size = static_cast<uint64_t>(m.gguf().size());
    out.name = st.name.c_str();
    out.architecture = st.architecture.c_str();
    out.backend = st.backend.c_str();
    out.kernels = st.kernels.c_str();
    std::memcpy(static_cast<void*>(info), &out, size);
    info->struct_size = size;
    return CB_OK;
  });
}

// ---------------------------------------------------------------------------
// Tokens and text

cb_status cb_tokenize(const cb_model* model, const char* text, size_t text_len, int add_special,
                      int parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens) {
  return guard("cb_tokenize", [&] {
    const cb::Model& m = model_of(model);
    require(n_tokens != nullptr, "n_tokens is NULL");
    require(text != nullptr || text_len == 0, "text is NULL");
    if (text_len == CB_NUL_TERMINATED) text_len = std::strlen(text);
    const std::string_view sv =
        text_len == 0 ? std::string_view() : std::string_view(text, text_len);
    const std::vector<int32_t> ids = m.tokenizer().encode(sv, add_special != 0, parse_special != 0);
    *n_tokens = ids.size();
    if (tokens == nullptr && capacity == 0) return CB_OK;
    require(tokens != nullptr, "tokens is NULL but capacity is not 0");
    if (capacity < ids.size())
      throw ApiError{CB_ERR_BUFFER_TOO_SMALL,
                     "token buffer too small (the count needed is in *n_tokens)"};
    std::copy(ids.begin(), ids.end(), tokens);
    return CB_OK;
  });
}

cb_status cb_detokenize(const cb_model* model, const int32_t* tokens, size_t n_tokens,
                        int render_special, char* buf, size_t capacity, size_t* out_len) {
  return guard("cb_detokenize", [&] {
    const cb::Model& m = model_of(model);
    require(out_len != nullptr, "out_len is NULL");
    require(tokens != nullptr || n_tokens == 0, "tokens is NULL");
    const int32_t n_vocab = m.tokenizer().n_vocab();
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= n_vocab)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                            " is outside 0.." + std::to_string(n_vocab - 1));
    const std::string text =
        n_tokens == 0
            ? std::string()
            : m.tokenizer().decode(std::span<const int32_t>(tokens, n_tokens), render_special != 0);
    return write_text(text, buf, capacity, out_len);
  });
}

cb_status cb_token_to_piece(const cb_model* model, int32_t token, int render_special, char* buf,
                            size_t capacity, size_t* out_len) {
  return guard("cb_token_to_piece", [&] {
    const cb::Model& m = model_of(model);
    require(out_len != nullptr, "out_len is NULL");
    const int32_t n_vocab = m.tokenizer().n_vocab();
    if (token < 0 || token >= n_vocab)
      throw cb::Error(
          cb::ErrorCode::kInvalidArgument,
          "token id " + std::to_string(token) + " is outside 0.." + std::to_string(n_vocab - 1));
    return write_text(m.tokenizer().token_to_piece(token, render_special != 0), buf, capacity,
                      out_len);
  });
}

int32_t cb_token_bos(const cb_model* model) {
  if (!is_live(model)) return -1;
  return model->state->model->tokenizer().bos_id();
}

int32_t cb_token_eos(const cb_model* model) {
  if (!is_live(model)) return -1;
  return model->state->model->tokenizer().eos_id();
}

int cb_token_is_end_of_generation(const cb_model* model, int32_t token) {
  if (!is_live(model)) return 0;
  try {
    const cb::Tokenizer& t = model->state->model->tokenizer();
    if (token < 0 || token >= t.n_vocab()) return 0;
    return t.is_end_of_generation(token) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

cb_status cb_chat_format(const cb_model* model, const cb_chat_message* messages, size_t n_messages,
                         int add_assistant_header, char* buf, size_t capacity, size_t* out_len) {
  return guard("cb_chat_format", [&] {
    (void)model_of(model);  // the template will come from the model's metadata
    require(out_len != nullptr, "out_len is NULL");
    require(messages != nullptr || n_messages == 0, "messages is NULL");
    std::vector<cb::ChatMessage> msgs;
    msgs.reserve(n_messages);
    for (size_t i = 0; i < n_messages; ++i) {
      require(messages[i].role != nullptr, "a message's role is NULL");
      require(messages[i].content != nullptr, "a message's content is NULL");
      msgs.push_back({messages[i].role, messages[i].content});
    }
    return write_text(cb::format_chatml(msgs, add_assistant_header != 0), buf, capacity, out_len);
  });
}

// ---------------------------------------------------------------------------
// Session

void cb_session_options_init(cb_session_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
}

cb_status cb_session_create(cb_model* model, const cb_session_options* opts,
                            cb_session** out_session) {
  return guard("cb_session_create", [&] {
    (void)model_of(model);
    require(out_session != nullptr, "out_session is NULL");
    const cb_session_options o = read_options(
        opts, cb_session_options_init, sizeof(cb_session_options),
        "cb_session_options.struct_size is not a known size (use cb_session_options_init)");
    require(o.n_ctx >= 0, "n_ctx must be >= 0 (0: the default)");
    require(o.n_threads >= 0 && o.n_threads <= cb::ThreadPool::kMaxThreads,
            "n_threads must be in [0, 512] (0: the model's default)");
    require(o.n_batch >= 0, "n_batch must be >= 0 (0: the default)");
    cb::SessionOptions so;
    so.n_ctx = o.n_ctx;
    so.n_threads = o.n_threads > 0 ? o.n_threads : model->state->n_threads;
    if (o.n_batch > 0) so.n_batch = o.n_batch;
    so.backend = model->state->backend_kind;
    so.device = model->state->device;
    auto handle = std::make_unique<cb_session>();
    handle->state = model->state;
    handle->n_threads = so.n_threads;
    handle->session = std::make_unique<cb::Session>(*model->state->model, so);
    handle->generator = std::make_unique<cb::Generator>(*handle->session);
    live_handles().add(HandleKind::kSession, handle.get());
    *out_session = handle.release();
    return CB_OK;
  });
}

void cb_session_free(cb_session* session) {
  if (session == nullptr || !live_handles().remove(HandleKind::kSession, session)) return;
  // Called from the token callback of a cb_generate on this session: that
  // call is still using it and deletes it when it returns.
  if (session->generating) {
    session->free_requested = true;
    return;
  }
  delete session;
}

cb_status cb_session_prefill(cb_session* session, const int32_t* tokens, size_t n_tokens) {
  return guard("cb_session_prefill", [&] {
    SessionUse use(session);
    require(tokens != nullptr, "tokens is NULL");
    require(n_tokens > 0, "n_tokens is 0");
    session->generator->prefill(std::span<const int32_t>(tokens, n_tokens));
    return CB_OK;
  });
}

int32_t cb_session_n_past(const cb_session* session) {
  return is_live(session) ? clamp_i32(session->generator->n_past()) : 0;
}

int32_t cb_session_n_ctx(const cb_session* session) {
  return is_live(session) ? clamp_i32(session->session->n_ctx()) : 0;
}

cb_status cb_session_logits(const cb_session* session, const float** logits, size_t* n_vocab) {
  return guard("cb_session_logits", [&] {
    SessionUse use(session);
    require(logits != nullptr, "logits is NULL");
    require(n_vocab != nullptr, "n_vocab is NULL");
    const std::span<const float> kept = session->generator->logits();
    require(!kept.empty(),
            "the session has no logits to give: prefill it first (after generation the last "
            "token is pending until the next call)");
    *logits = kept.data();
    *n_vocab = kept.size();
    return CB_OK;
  });
}

cb_status cb_session_set_abort_callback(cb_session* session, cb_abort_callback callback,
                                        void* user_data) {
  return guard("cb_session_set_abort_callback", [&] {
    SessionUse use(session);
    if (callback == nullptr) {
      session->session->set_stop_check({});
    } else {
      session->session->set_stop_check([callback, user_data] { return callback(user_data) != 0; });
    }
    return CB_OK;
  });
}

cb_status cb_session_reset(cb_session* session) {
  return guard("cb_session_reset", [&] {
    SessionUse use(session);
    session->generator->reset();
    return CB_OK;
  });
}

// ---------------------------------------------------------------------------
// Sampling and generation

void cb_sampling_options_init(cb_sampling_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->temperature = 0.0f;
  opts->top_k = 0;
  opts->top_p = 1.0f;
  opts->seed = 0;
  opts->min_p = 0.0f;
  opts->repeat_penalty = 1.0f;
  opts->repeat_last_n = 64;
}

void cb_generate_options_init(cb_generate_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->max_tokens = 256;
  opts->stop_at_end_of_generation = 1;
  opts->sampling = nullptr;
}

void cb_generate_stats_init(cb_generate_stats* stats) {
  if (stats == nullptr) return;
  std::memset(static_cast<void*>(stats), 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

cb_status cb_generate(cb_session* session, const int32_t* prompt, size_t n_prompt,
                      const cb_generate_options* opts, cb_token_callback callback, void* user_data,
                      cb_generate_stats* stats) {
  return guard("cb_generate", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    SessionUse use(session);
    require(prompt != nullptr || n_prompt == 0, "prompt is NULL");
    const size_t stats_size =
        stats == nullptr
            ? 0
            : output_size(stats, sizeof(cb_generate_stats),
                          "stats->struct_size is not a known size (use cb_generate_stats_init)");
    const cb_generate_options o = read_options(
        opts, cb_generate_options_init, offsetof(cb_generate_options, stop_strings),
        "cb_generate_options.struct_size is not a known size (use cb_generate_options_init)");
    require(o.stop_strings != nullptr || o.n_stop_strings == 0,
            "stop_strings is NULL but n_stop_strings is not 0");
    std::vector<std::string> stop_texts;
    for (size_t i = 0; i < o.n_stop_strings; ++i) {
      if (o.stop_strings[i] == nullptr)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "stop_strings[" + std::to_string(i) + "] is NULL");
      stop_texts.emplace_back(o.stop_strings[i]);
    }
    const cb::StopStrings stops(std::move(stop_texts));  // refuses empty strings
    const cb_sampling_options so = read_options(
        o.sampling, cb_sampling_options_init, offsetof(cb_sampling_options, min_p),
        "cb_sampling_options.struct_size is not a known size (use cb_sampling_options_init)");
    cb::SamplerOptions sopt;
    sopt.temperature = so.temperature;
    sopt.top_k = so.top_k;
    sopt.top_p = so.top_p;
    sopt.min_p = so.min_p;
    sopt.repeat_penalty = so.repeat_penalty;
    sopt.repeat_last_n = so.repeat_last_n;
    sopt.seed = so.seed;
    cb::Sampler sampler(sopt);  // validates the values

    cb_generate_stats st;
    cb_generate_stats_init(&st);
    auto publish = [&] {
      if (stats != nullptr) {
        std::memcpy(static_cast<void*>(stats), &st, stats_size);
        stats->struct_size = stats_size;
      }
    };

    // The token callback runs inside this call: meanwhile the session refuses
    // other calls (SessionUse), and a cb_session_free from the callback is
    // carried out here, on the way out, once nothing uses the session.
    struct GeneratingScope {
      cb_session* session;
      SessionUse& use;
      GeneratingScope(cb_session* s, SessionUse& u) : session(s), use(u) {
        session->generating = true;
      }
      ~GeneratingScope() {
        session->generating = false;
        use.release();
        if (session->free_requested) delete session;
      }
      GeneratingScope(const GeneratingScope&) = delete;
      GeneratingScope& operator=(const GeneratingScope&) = delete;
    } generating(session, use);

    const cb::TokenSink sink = [&](int32_t t, const std::string& piece) {
      // The piece ends with a NUL for the callback (std::string's).
      return callback == nullptr ||
             (callback(t, piece.c_str(), piece.size(), user_data) == 0 && !session->free_requested);
    };
    const cb::GenerationStats g = session->generator->generate(
        std::span<const int32_t>(prompt, n_prompt),
        {.max_tokens = o.max_tokens, .stop_at_end_of_generation = o.stop_at_end_of_generation != 0},
        sampler, stops, sink, t0);
    st.n_prompt = g.n_prompt;
    st.n_generated = g.n_generated;
    st.ttft_ms = g.ttft_ms;
    st.prefill_ms = g.prefill_ms;
    st.decode_ms = g.decode_ms;
    st.tok_s = g.tok_s;
    st.stop_reason = stop_reason_of(g.stop);
    const bool by_abort_callback = g.aborted;
    const cb_status result = g.stop == cb::StopReason::kCancelled ? CB_ERR_CANCELLED : CB_OK;
    publish();
    if (result == CB_ERR_CANCELLED)
      return fail_with(CB_ERR_CANCELLED, "cb_generate",
                       (session->free_requested
                            ? "the token callback freed the session; generation stopped after "
                        : by_abort_callback ? "generation cancelled by the abort callback after "
                                            : "generation cancelled by the token callback after ") +
                           std::to_string(st.n_generated) + " tokens");
    return result;
  });
}

// ---------------------------------------------------------------------------
// Retrieval-augmented prefill

cb_status cb_chunk_cache_create(cb_chunk_cache** out_cache) {
  return guard("cb_chunk_cache_create", [&] {
    require(out_cache != nullptr, "out_cache is NULL");
    auto cache = std::make_unique<cb_chunk_cache>();
    live_handles().add(HandleKind::kCache, cache.get());
    *out_cache = cache.release();
    return CB_OK;
  });
}

void cb_store_options_init(cb_store_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  const cb::cache::StoreOptions d;
  opts->capacity_bytes = d.capacity_bytes;
  opts->codec = static_cast<cb_codec>(d.codec);
  opts->read_bytes_per_sec = d.read_bytes_per_sec;
  opts->busy_timeout_ms = d.busy_timeout_ms;
}

cb_status cb_chunk_cache_open(const char* dir, const cb_store_options* opts,
                              cb_chunk_cache** out_cache) {
  return guard("cb_chunk_cache_open", [&] {
    require(out_cache != nullptr, "out_cache is NULL");
    *out_cache = nullptr;
    require(dir != nullptr && *dir != '\0', "dir is NULL or empty");
    cb_store_options o;
    cb_store_options_init(&o);
    if (opts != nullptr) {
      // Callers built before assumed_read_bytes_per_sec existed pass a
      // smaller struct: still valid, the new field keeps its default.
      const size_t size = output_size(
          opts, offsetof(cb_store_options, assumed_read_bytes_per_sec),
          "cb_store_options.struct_size is not a known size (use cb_store_options_init)");
      std::memcpy(static_cast<void*>(&o), opts, size);
    }
    const int codec = enum_value(o.codec);
    require(codec == CB_CODEC_F16 || codec == CB_CODEC_Q8 || codec == CB_CODEC_Q4,
            "unknown codec (use CB_CODEC_F16, CB_CODEC_Q8 or CB_CODEC_Q4)");
    require(o.capacity_bytes > 0, "capacity_bytes must be positive");
    require(o.busy_timeout_ms >= 0, "busy_timeout_ms must not be negative");
    require(std::isfinite(o.assumed_read_bytes_per_sec) && o.assumed_read_bytes_per_sec >= 0.0,
            "assumed_read_bytes_per_sec must be a finite number >= 0");
    cb::cache::StoreOptions so;
    so.capacity_bytes = o.capacity_bytes;
    so.codec = static_cast<cb::cache::Codec>(codec);
    so.read_bytes_per_sec = o.read_bytes_per_sec;
    so.busy_timeout_ms = o.busy_timeout_ms;
    auto cache = std::make_unique<cb_chunk_cache>();
    cache->assumed_read_bytes_per_sec = o.assumed_read_bytes_per_sec;
    cache->flash = std::make_unique<cb::FlashChunkStore>(
        std::shared_ptr<cb::cache::ChunkStore>(cb::cache::ChunkStore::open(dir, so)));
    live_handles().add(HandleKind::kCache, cache.get());
    *out_cache = cache.release();
    return CB_OK;
  });
}

cb_status cb_chunk_cache_flush(cb_chunk_cache* cache) {
  return guard("cb_chunk_cache_flush", [&] {
    check_cache(cache);
    if (cache->flash) cache->flash->store().flush();
    return CB_OK;
  });
}

void cb_chunk_cache_free(cb_chunk_cache* cache) {
  if (cache == nullptr || !live_handles().remove(HandleKind::kCache, cache)) return;
  // Pending write-backs finish before the store closes; a failure here has
  // nowhere to be reported, and the entries it concerns are simply absent.
  try {
    if (cache->flash) cache->flash->store().flush();
  } catch (...) {
  }
  delete cache;
}

void cb_chunk_cache_stats_init(cb_chunk_cache_stats* stats) {
  if (stats == nullptr) return;
  std::memset(static_cast<void*>(stats), 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

cb_status cb_chunk_cache_get_stats(const cb_chunk_cache* cache, cb_chunk_cache_stats* stats) {
  return guard("cb_chunk_cache_get_stats", [&] {
    check_cache(cache);
    const size_t size = output_size(
        stats, sizeof(cb_chunk_cache_stats),
        "stats is NULL or stats->struct_size is not a known size (use cb_chunk_cache_stats_init)");
    cb_chunk_cache_stats out;
    cb_chunk_cache_stats_init(&out);
    if (cache->flash) {
      const cb::cache::StoreStats st = cache->flash->store().stats();
      out.n_entries = st.entries;
      out.bytes = st.bytes;
      out.hits = st.hits;
      out.misses = st.misses;
      out.evictions = st.evictions;
      out.corrupt_drops = st.corrupt_drops;
      out.bytes_read = st.bytes_read;
    } else {
      out.n_entries = cache->table.size();
      out.bytes = cache->table.bytes();
    }
    std::memcpy(static_cast<void*>(stats), &out, size);
    stats->struct_size = size;
    return CB_OK;
  });
}

cb_status cb_chunk_cache_clear(cb_chunk_cache* cache) {
  return guard("cb_chunk_cache_clear", [&] {
    check_cache(cache);
    if (cache->flash) {
      cache->flash->store().clear();
    } else {
      cache->table.clear();
    }
    return CB_OK;
  });
}

const char* cb_mode_name(cb_mode mode) {
  switch (enum_value(mode)) {
    case CB_MODE_FULL:
      return "full";
    case CB_MODE_PREFIX:
      return "prefix";
    case CB_MODE_REUSE:
      return "reuse";
    case CB_MODE_BLEND:
      return "blend";
  }
  return "unknown";
}

namespace {

// The runtime's policy for a cb_select value; none for values outside the
// enum (read through enum_value, by reference: a caller may have stored any
// int there).
std::optional<cb::Selection> selection_of(const cb_select& select) {
  switch (enum_value(select)) {
    case CB_SELECT_DEFAULT:
      return cb::default_selection();
    case CB_SELECT_HKVD:
      return cb::Selection::kHkvd;
    case CB_SELECT_HKVD_KV:
      return cb::Selection::kHkvdKv;
    case CB_SELECT_ATTENTION:
      return cb::Selection::kAttention;
    case CB_SELECT_LOOKAHEAD:
      return cb::Selection::kLookahead;
    case CB_SELECT_RANDOM:
      return cb::Selection::kRandom;
    case CB_SELECT_ORACLE:
      return cb::Selection::kOracle;
  }
  return std::nullopt;
}

}  // namespace

const char* cb_select_name(cb_select select) {
  const std::optional<cb::Selection> s = selection_of(select);
  return s ? cb::selection_name(*s) : "unknown";
}

void cb_rag_options_init(cb_rag_options* opts) {
  if (opts == nullptr) return;
  std::memset(static_cast<void*>(opts), 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->mode = CB_MODE_BLEND;
  opts->ratio = cb::kDefaultRatio;
  opts->schedule = nullptr;
  opts->n_schedule = 0;
  opts->chunk_head = CB_CHUNK_HEAD_PROMPT;
  opts->system_prompt = nullptr;
  opts->cache_namespace = nullptr;
  opts->pipeline = 1;
  opts->auto_ratio = 0;
  opts->select = CB_SELECT_DEFAULT;
  opts->sink_tokens = 0;
  opts->seed = 0;
  opts->guard_share = 0.0f;
  opts->guard_max_ratio = 0.5f;
}

cb_status cb_chunk_cache_add(cb_session* session, cb_chunk_cache* cache, const char* chunk_text,
                             const cb_rag_options* opts, int32_t* out_computed,
                             int32_t* out_n_tokens) {
  return guard("cb_chunk_cache_add", [&] {
    SessionUse use(session);
    check_cache(cache);
    require(chunk_text != nullptr, "chunk_text is NULL");
    require(session->generator->n_past() == 0,
            "the session is not empty (reset the session first with cb_session_reset)");
    cb::Session& s = *session->session;
    const ChunkEntry e = chunk_entry(*session->state->model, chunk_text, opts);
    const int64_t n_ctx = s.n_ctx();
    const int64_t len = static_cast<int64_t>(e.tokens.size());
    const int64_t head_len = static_cast<int64_t>(e.head.size());
    if (len + head_len > n_ctx)
      throw cb::Error(
          cb::ErrorCode::kContextOverflow,
          "the chunk is " + std::to_string(len) + " tokens long" +
              (head_len > 0 ? " (plus a " + std::to_string(head_len) + "-token chunk head)"
                            : std::string()) +
              ", more than the session's context of " + std::to_string(n_ctx) + " tokens");
    int32_t computed = 0;
    // rag_prefill skips empty chunks, so there is nothing to store for one
    // (the trailing blank line makes that impossible today).
    if (!e.tokens.empty() && !cache->kv().find(e.key)) {
      session->generator->forget_logits();
      cb::cache::ChunkKV kv;
      try {
        kv = cb::precompute_chunk_kv(s, e.head, e.tokens);
      } catch (...) {
        s.truncate(0);  // the session is left empty whatever happened
        throw;
      }
      if (cache->flash) {
        // Written now, not queued like a request's misses: an ingest step
        // adds many chunks quickly and must not lose any to a full
        // write-back queue, and the chunk must be found right after.
        cb::cache::PutResult put;
        try {
          put = cache->flash->store().put(e.key, kv.view());
        } catch (const cb::Error& err) {
          // The store refuses values its codec cannot hold (inf, NaN, beyond
          // f16): not the caller's argument, so not INVALID_ARGUMENT.
          if (err.code() != cb::ErrorCode::kInvalidArgument) throw;
          throw cb::Error(cb::ErrorCode::kUnsupported,
                          std::string("the chunk's KV cannot be stored on flash: ") + err.what());
        }
        if (put == cb::cache::PutResult::kNoRoom)
          throw ApiError{CB_ERR_IO,
                         "the chunk does not fit in the cache on flash (larger than its "
                         "capacity_bytes, or every other entry is pinned)"};
      } else {
        cache->table.put(e.key, std::move(kv));
      }
      computed = 1;
    }
    if (out_computed != nullptr) *out_computed = computed;
    if (out_n_tokens != nullptr) *out_n_tokens = clamp_i32(len);
    return CB_OK;
  });
}

cb_status cb_chunk_cache_contains(const cb_model* model, cb_chunk_cache* cache,
                                  const char* chunk_text, const cb_rag_options* opts,
                                  int32_t* out_found) {
  return guard("cb_chunk_cache_contains", [&] {
    const cb::Model& m = model_of(model);
    check_cache(cache);
    require(chunk_text != nullptr, "chunk_text is NULL");
    require(out_found != nullptr, "out_found is NULL");
    const ChunkEntry e = chunk_entry(m, chunk_text, opts);
    *out_found = !e.tokens.empty() && cache->kv().find(e.key) != nullptr ? 1 : 0;
    return CB_OK;
  });
}

cb_status cb_chunk_cache_remove(const cb_model* model, cb_chunk_cache* cache,
                                const char* chunk_text, const cb_rag_options* opts,
                                int32_t* out_removed) {
  return guard("cb_chunk_cache_remove", [&] {
    const cb::Model& m = model_of(model);
    check_cache(cache);
    require(chunk_text != nullptr, "chunk_text is NULL");
    const ChunkEntry e = chunk_entry(m, chunk_text, opts);
    const bool removed = !e.tokens.empty() && cache->kv().remove(e.key);
    if (out_removed != nullptr) *out_removed = removed ? 1 : 0;
    return CB_OK;
  });
}

void cb_rag_stats_init(cb_rag_stats* stats) {
  if (stats == nullptr) return;
  std::memset(static_cast<void*>(stats), 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

cb_status cb_rag_prefill(cb_session* session, cb_chunk_cache* cache, const char* const* chunk_texts,
                         size_t n_chunks, const char* question, const cb_rag_options* opts,
                         cb_rag_stats* stats) {
  return guard("cb_rag_prefill", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    SessionUse use(session);
    require(chunk_texts != nullptr || n_chunks == 0, "chunk_texts is NULL");
    require(n_chunks > 0,
            "no chunks: a request without documents is a plain prompt (use cb_generate)");
    for (size_t i = 0; i < n_chunks; ++i)
      if (chunk_texts[i] == nullptr)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "chunk_texts[" + std::to_string(i) + "] is NULL");
    require(question != nullptr, "question is NULL");
    const size_t stats_size =
        stats == nullptr
            ? 0
            : output_size(stats, offsetof(cb_rag_stats, upload_ms),
                          "stats->struct_size is not a known size (use cb_rag_stats_init)");
    const cb_rag_options o = read_rag_options(opts);
    require(o.schedule != nullptr || o.n_schedule == 0, "schedule is NULL but n_schedule is not 0");
    require(session->generator->n_past() == 0,
            "the session is not empty (reset the session first with cb_session_reset)");

    cb::RagPrefillOptions ro;
    switch (enum_value(o.mode)) {
      case CB_MODE_FULL:
        ro.blend.mode = cb::BlendMode::kFull;
        break;
      case CB_MODE_PREFIX:
        ro.blend.mode = cb::BlendMode::kPrefix;
        break;
      case CB_MODE_REUSE:
        ro.blend.mode = cb::BlendMode::kReuse;
        break;
      case CB_MODE_BLEND:
        ro.blend.mode = cb::BlendMode::kBlend;
        break;
      default:
        invalid("unknown mode value (use a cb_mode)");
    }
    const ChunkKeyOptions key_opts = chunk_key_options(o);
    ro.chunk_head = key_opts.head;
    ro.ns = key_opts.ns;
    const std::optional<cb::Selection> selection = selection_of(o.select);
    require(selection.has_value(), "unknown select value (use a cb_select)");
    ro.blend.selection = *selection;
    ro.blend.sink_tokens = o.sink_tokens;
    ro.blend.seed = o.seed;
    ro.blend.guard_share = o.guard_share;
    ro.blend.guard_max_ratio = o.guard_max_ratio;
    ro.blend.schedule.clear();
    if (o.n_schedule == 0) {
      ro.blend.schedule = cb::single_check_schedule(ro.blend.selection, o.ratio);
    } else {
      for (size_t i = 0; i < o.n_schedule; ++i)
        ro.blend.schedule.push_back({o.schedule[i].layer, o.schedule[i].ratio});
    }
    if (ro.blend.mode != cb::BlendMode::kFull)
      require(cache != nullptr, "cache is NULL (only CB_MODE_FULL runs without a chunk cache)");
    if (cache != nullptr) check_cache(cache);
    ro.pipeline.enabled = o.pipeline != 0;
    if (o.auto_ratio != 0) {
      require(ro.blend.mode == cb::BlendMode::kBlend, "auto_ratio needs CB_MODE_BLEND");
      require(cache != nullptr && cache->flash,
              "auto_ratio needs a chunk cache on flash (cb_chunk_cache_open)");
      ro.min_ratio = o.ratio;  // the quality floor
    }

    cb::Session& s = *session->session;
    const cb::Model& model = *session->state->model;
    // The options are checked before any work, in every mode (a bad ratio
    // is the caller's bug even where it is not used).
    {
      cb::BlendOptions check = ro.blend;
      check.mode = cb::BlendMode::kBlend;
      cb::validate_blend_options(check, model.hparams().n_layer);
    }

    std::vector<std::string> texts;
    texts.reserve(n_chunks);
    for (size_t i = 0; i < n_chunks; ++i) texts.emplace_back(chunk_texts[i]);
    const cb::RagPrompt prompt =
        cb::build_rag_prompt(model.tokenizer(), key_opts.system_prompt, texts, question);

    // Sizes against the context before any work, with the reason.
    const int64_t n_ctx = s.n_ctx();
    const int64_t head_len =
        ro.chunk_head == cb::ChunkHead::kPrompt ? static_cast<int64_t>(prompt.head.size()) : 0;
    for (size_t i = 0; i < prompt.chunks.size(); ++i) {
      const int64_t len = static_cast<int64_t>(prompt.chunks[i].size());
      if (len + head_len > n_ctx)
        throw cb::Error(
            cb::ErrorCode::kContextOverflow,
            "chunk " + std::to_string(i) + " is " + std::to_string(len) + " tokens long" +
                (head_len > 0 ? " (plus a " + std::to_string(head_len) + "-token chunk head)"
                              : std::string()) +
                ", more than the session's context of " + std::to_string(n_ctx) + " tokens");
    }
    int64_t n_total = static_cast<int64_t>(prompt.head.size() + prompt.suffix.size());
    for (const auto& c : prompt.chunks) n_total += static_cast<int64_t>(c.size());
    if (n_total > n_ctx)
      throw cb::Error(cb::ErrorCode::kContextOverflow,
                      "the request is " + std::to_string(n_total) + " tokens (prompt head " +
                          std::to_string(prompt.head.size()) + ", " + std::to_string(n_chunks) +
                          " chunks, question " + std::to_string(prompt.suffix.size()) +
                          "), more than the session's context of " + std::to_string(n_ctx) +
                          " tokens");

    session->generator->forget_logits();
    cb::RagPrefillStats rs;
    std::span<const float> logits;
    std::unique_lock<std::mutex> auto_lock;
    std::string device;
    try {
      if (o.auto_ratio != 0) {
        // Serialized per cache: the controller learns from each request.
        auto_lock = std::unique_lock<std::mutex>(cache->auto_mu);
        if (!cache->calibration_db)
          cache->calibration_db =
              cb::CalibrationDb::open(cache->flash->store().dir() + "/calibration.sqlite");
        device = cb::default_device_id(s.backend().name(), session->n_threads);
        auto& ctrl = cache->controllers[device + "/" + model.fingerprint()];
        if (!ctrl) {
          // The compute probe runs in this (still empty) session: sized to
          // its context (rows x prefix lengths must fit).
          cb::ComputeProbe probe;
          const int64_t room = s.n_ctx();
          probe.rows = {std::max<int64_t>(1, std::min<int64_t>(16, room / 8)),
                        std::max<int64_t>(2, std::min<int64_t>(96, room / 4))};
          probe.contexts = {0, std::max<int64_t>(1, std::min<int64_t>(512, room - probe.rows[1]))};
          cb::Calibration cal = cb::load_or_probe_compute(*cache->calibration_db, device, s, probe);
          // The caller's read speed is pinned (refreshes leave it); without
          // one, a speed pinned by an earlier caller is measured again.
          if (cache->assumed_read_bytes_per_sec > 0.0) {
            cal.set_tier({{"flash", cache->assumed_read_bytes_per_sec, 0}, 0, true});
          } else if (const cb::CalibratedTier* t = cal.find_tier("flash"); t && t->pinned) {
            cb::CalibratedTier measured = *t;
            measured.pinned = false;
            cal.set_tier(measured);
          }
          ctrl = std::make_unique<cb::LoadingController>(std::move(cal));
        }
        ro.controller = ctrl.get();
        ro.storage_tier = "flash";
      }
      logits = cb::rag_prefill(s, prompt, cache != nullptr ? &cache->kv() : nullptr, ro, &rs);
      if (ro.controller)
        cache->calibration_db->save(device, model.fingerprint(), ro.controller->calibration());
    } catch (...) {
      s.truncate(0);  // whatever happened, the session is left empty
      throw;
    }
    const double total_ms = ms_since(t0);
    session->generator->set_logits(logits, total_ms);

    if (stats != nullptr) {
      cb_rag_stats out;
      cb_rag_stats_init(&out);
      out.n_tokens = clamp_i32(rs.fusion.n_tokens);
      out.n_reused = clamp_i32(rs.fusion.n_reused);
      out.cache_hits = clamp_i32(rs.cache_hits);
      out.cache_misses = clamp_i32(rs.cache_misses);
      out.chunks_recomputed = clamp_i32(rs.fusion.chunks_recomputed);
      out.precompute_ms = rs.precompute_ms;
      out.fuse_ms = rs.fusion.compute_ms;
      out.computed_fraction = rs.fusion.computed_fraction();
      switch (ro.blend.mode) {
        case cb::BlendMode::kFull:
          out.ratio = 1.0f;
          break;
        case cb::BlendMode::kBlend:
          out.ratio =
              rs.choice ? static_cast<float>(rs.choice->ratio) : ro.blend.schedule.front().ratio;
          if (rs.fusion.guard_raised) out.ratio = static_cast<float>(rs.fusion.ratio);
          break;
        default:
          out.ratio = 0.0f;
      }
      out.pipelined = rs.fusion.pipelined ? 1 : 0;
      out.bytes_read = rs.fusion.bytes_read;
      out.load_ms = rs.fusion.load_ms;
      out.blocked_ms = rs.fusion.blocked_ms;
      out.recompute_ms = rs.fusion.recompute_ms;
      out.upload_ms = rs.fusion.upload_ms;
      out.selected_share = rs.fusion.selected_share;
      out.guard_raised = rs.fusion.guard_raised ? 1 : 0;
      out.total_ms = total_ms;
      std::memcpy(static_cast<void*>(stats), &out, stats_size);
      stats->struct_size = stats_size;
    }
    return CB_OK;
  });
}

}  // extern "C"
