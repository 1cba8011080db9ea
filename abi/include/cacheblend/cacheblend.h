/*
 * cacheblend.h -- the public C API of cacheblend-rt, an on-device LLM
 * inference runtime for Llama-family GGUF models.
 *
 * This header is C99 and is the only file an application needs.  Everything
 * is reached through opaque handles that are created and destroyed
 * explicitly.
 *
 * ERROR HANDLING
 *   Every fallible function returns a cb_status.  CB_OK (0) is success; any
 *   other value is an error and the function's out-parameters are then left
 *   unchanged unless the function's documentation says otherwise.  On error
 *   a readable message is stored for the calling thread and can be read with
 *   cb_last_error() until the next failing call on the same thread.  A call
 *   that succeeds clears it to "".  cb_status_string() gives a fixed text for
 *   each status code.  No C++ exception ever leaves this library; NULL
 *   handles, NULL strings and NULL out-parameters are reported as
 *   CB_ERR_INVALID_ARGUMENT, never as a crash.  The library keeps a registry
 *   of the handles it has given out and checks every handle before using
 *   it, so a handle that has been freed, or a pointer that is not a handle
 *   of the expected type (a cb_session* cast to cb_model*, garbage), gives
 *   CB_ERR_INVALID_ARGUMENT with a message saying the handle is not live;
 *   functions without a status return their documented "NULL" value for
 *   it.  This is a safety net, not a guarantee: a freed handle whose address
 *   has been reused for a new handle of the same type is taken for the new
 *   one, and a free racing with another call on the same handle is
 *   undefined behaviour.
 *
 * STRINGS
 *   Text is UTF-8.  Strings returned as `const char*` are owned by the
 *   library: do not free them.  Each function says how long they stay valid.
 *   Functions that produce text or token arrays write into caller buffers
 *   with the "size query" pattern described at cb_tokenize().
 *
 * OPTIONS STRUCTS
 *   Every options struct starts with `size_t struct_size`.  Always fill one
 *   with its *_init() function (which sets struct_size = sizeof(struct) and
 *   every field to its default) and then change the fields you care about.
 *   The library accepts the struct sizes of this and of earlier header
 *   versions; an unknown struct_size gives CB_ERR_INVALID_ARGUMENT.  Passing
 *   NULL instead of an options struct means "all defaults".
 *   The *_init() functions are inline: they pass sizeof(struct) as this
 *   header declares it to cb_*_init_sized(), which writes that many bytes
 *   and no more, so a newer library with a longer struct never writes past
 *   a program's own.  Bindings that lay out a struct themselves call
 *   cb_*_init_sized() with their size.
 *
 * COMPATIBILITY
 *   From 0.1.0 on, a program built against an earlier header of this major
 *   version runs with a later library unchanged: no function is removed or
 *   changes its signature or meaning, enum values keep their numbers, and
 *   struct fields are only appended (the sizes of earlier structs stay
 *   accepted: "Added after X" marks where a struct used to end, and the
 *   reservedN fields keep a new field out of the padding an earlier struct
 *   ended with).  The shared library's soname changes with the major
 *   version only (libcacheblend.so.0).  Not covered: the experimental
 *   header (cacheblend_experimental.h), the text of error messages, and
 *   numerical results beyond each function's stated tolerance.
 *
 * THREADING
 *   A cb_model is immutable after loading: it may be shared by any number of
 *   sessions used concurrently on different threads, and the functions that
 *   take a `const cb_model*` may be called from any thread at any time.  A
 *   cb_session is used by one thread at a time (calls on one session must be
 *   serialized by the caller: a prefill, reset, logits, generate or RAG call
 *   made while another thread is inside one on the same session fails with
 *   CB_ERR_INVALID_ARGUMENT); different sessions may run in parallel.  A
 *   cb_chunk_cache may be used by any number of threads at once.  Freeing a
 *   handle must not race with any other call that uses it.  Token callbacks
 *   run on the thread that called cb_generate, abort and progress callbacks
 *   on the thread of the call they report on.  cb_last_error() is per
 *   thread.
 *
 * LIFETIMES
 *   cb_model_load() -> cb_model_free(); cb_session_create() ->
 *   cb_session_free(); cb_chunk_cache_create() or cb_chunk_cache_open() ->
 *   cb_chunk_cache_free().  Every free function ignores NULL and a handle
 *   that is not live (so a second free is harmless).  A session keeps its
 *   model alive: cb_model_free() may be called while sessions still exist;
 *   the cb_model* handle is dead from then on (cb_session_create and the
 *   model functions refuse it), while the sessions go on working, and the
 *   model's memory is released when the last of them is freed.  A chunk
 *   cache is independent of models and sessions (its entries are keyed by the
 *   model's fingerprint); it must outlive every call that uses it.  Pointers
 *   the library returns (strings, logits) are owned by the library; each
 *   function says how long they stay valid.
 */
#ifndef CACHEBLEND_CACHEBLEND_H
#define CACHEBLEND_CACHEBLEND_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(CB_BUILDING_SHARED)
#define CB_API __declspec(dllexport)
#elif defined(CB_USING_SHARED)
#define CB_API __declspec(dllimport)
#else
#define CB_API
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define CB_API __attribute__((visibility("default")))
#else
#define CB_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                    */
/* ------------------------------------------------------------------------ */

#define CB_VERSION_MAJOR 0
#define CB_VERSION_MINOR 1
#define CB_VERSION_PATCH 0
#define CB_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define CB_VERSION_NUMBER (CB_VERSION_MAJOR * 10000 + CB_VERSION_MINOR * 100 + CB_VERSION_PATCH)

/* The library's version string ("0.1.0"), static.  Compare with
 * CB_VERSION_STRING to detect a header/library mismatch.  Thread-safe. */
CB_API const char* cb_version(void);
/* The library's CB_VERSION_NUMBER.  Thread-safe. */
CB_API int cb_version_number(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                    */
/* ------------------------------------------------------------------------ */

typedef enum cb_status {
  CB_OK = 0,
  CB_ERR_INVALID_ARGUMENT = 1, /* NULL handle/string, bad option value, bad struct_size */
  CB_ERR_IO = 2,               /* a file could not be opened, read, written or mapped */
  CB_ERR_FORMAT = 3,           /* a malformed file (GGUF model, cache blob) */
  CB_ERR_UNSUPPORTED = 4,      /* well-formed but not supported (tensor type, backend) */
  CB_ERR_OUT_OF_MEMORY = 5,    /* an allocation failed */
  CB_ERR_CONTEXT_OVERFLOW = 6, /* the tokens do not fit in the session's context */
  CB_ERR_CANCELLED = 7,        /* the caller's callback asked to stop */
  CB_ERR_BUFFER_TOO_SMALL = 8, /* a caller buffer is too small; the size needed is reported */
  CB_ERR_INTERNAL = 9          /* a bug in the library; please report it */
} cb_status;

/* A fixed English text for `status` ("invalid argument", ...); static, never
 * NULL (unknown values give "unknown status").  Thread-safe. */
CB_API const char* cb_status_string(cb_status status);

/* The message of the last failed call on the calling thread, or "" if the
 * last call succeeded.  Never NULL.  Valid UTF-8: control characters and
 * invalid bytes quoted from files (model metadata, paths) appear as \xNN.
 * The pointer stays valid until the next call into the library on the same
 * thread; copy it to keep it. */
CB_API const char* cb_last_error(void);

/* ------------------------------------------------------------------------ */
/* Model                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct cb_model cb_model;

/* The chat template families: how a conversation becomes prompt text
 * (cb_chat_format, and the turns around a RAG request's chunks). */
typedef enum cb_chat_template {
  /* The format the model's GGUF tokenizer.chat_template names, recognised by
   * its markers (or, without a template, by the vocabulary's control
   * tokens).  A template of an unknown family is not an error at load: the
   * calls that need a format give CB_ERR_UNSUPPORTED saying so. */
  CB_CHAT_TEMPLATE_AUTO = 0,
  CB_CHAT_TEMPLATE_CHATML = 1, /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
  CB_CHAT_TEMPLATE_LLAMA3 = 2, /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
  CB_CHAT_TEMPLATE_GEMMA = 3   /* <start_of_turn>role\n...<end_of_turn>\n; assistant is "model",
                                system text opens the next user turn */
} cb_chat_template;

typedef enum cb_backend {
  /* CUDA (cb_model_options.device) when the library was built with it (the
   * build found nvcc, or CB_CUDA=ON) and that CUDA device is present, else
   * the CPU. */
  CB_BACKEND_AUTO = 0,
  CB_BACKEND_CPU = 1,
  /* CUDA device cb_model_options.device.  cb_model_load gives
   * CB_ERR_UNSUPPORTED when the library was built without CUDA or that
   * device is not usable. */
  CB_BACKEND_CUDA = 2
} cb_backend;

typedef struct cb_model_options {
  size_t struct_size;
  /* Default number of compute threads for sessions of this model that do
   * not set their own; 0 (default) = all CPU cores; at most 512.  When the
   * system refuses to start a thread: CB_ERR_OUT_OF_MEMORY. */
  int32_t n_threads;
  cb_backend backend; /* default CB_BACKEND_AUTO */
  /* The CUDA device (0 .. count-1, CUDA's numbering, which
   * CUDA_VISIBLE_DEVICES remaps) for CB_BACKEND_CUDA and AUTO; default 0.
   * Ignored on the CPU.  Added in 0.1.x: a struct that ends before it
   * (older callers) means device 0. */
  int32_t device;
  /* The chat template family (default CB_CHAT_TEMPLATE_AUTO: the model's
   * own).  Added in 0.1.x: a struct that ends before it means AUTO. */
  cb_chat_template chat_template;
} cb_model_options;

/* Fills `opts` with defaults (struct_size included).  NULL is ignored. */
CB_API void cb_model_options_init_sized(cb_model_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_model_options_init(cb_model_options* opts) {
  cb_model_options_init_sized(opts, sizeof(*opts));
}
#endif

/* Loads a GGUF model (memory-mapped; the file must not change while the
 * model is loaded).  `opts` may be NULL for defaults.  On success *out_model
 * receives a new model; free it with cb_model_free().
 * On the CPU the kernel level is the best the CPU has, or the one the
 * environment variable CB_CPU_KERNELS names (avx512, avx2-vnni, avx2,
 * neon-dotprod, neon, scalar; auto or unset: the best); cb_model_get_info
 * reports it.
 * Errors: CB_ERR_INVALID_ARGUMENT (NULL path/out_model, bad options,
 * CB_CPU_KERNELS naming no level), CB_ERR_IO (cannot open/map),
 * CB_ERR_FORMAT (malformed file), CB_ERR_UNSUPPORTED (architecture, tensor
 * type, backend, a CB_CPU_KERNELS level this CPU or build lacks),
 * CB_ERR_OUT_OF_MEMORY.  Thread-safe. */
CB_API cb_status cb_model_load(const char* path, const cb_model_options* opts,
                               cb_model** out_model);

/* Releases the caller's reference to the model and makes the handle dead
 * (later calls with it give CB_ERR_INVALID_ARGUMENT); its memory goes when
 * the last session created from it is freed too.  The strings of its
 * cb_model_info become invalid.  NULL and a handle that is not live (a
 * second free) are ignored.  Must not race with other calls that use the
 * same handle. */
CB_API void cb_model_free(cb_model* model);

typedef struct cb_model_info {
  size_t struct_size; /* set by the caller (cb_model_info_init) */
  int32_t n_layer;
  int32_t n_embd;
  int32_t n_head;
  int32_t n_head_kv;
  int32_t head_dim;
  int32_t n_ff;
  int32_t n_vocab;
  int32_t n_ctx_train; /* the context length the model was trained with */
  uint64_t file_size;  /* bytes */
  /* The following strings are owned by the model: valid until
   * cb_model_free(model). */
  const char* name;         /* general.name, or the file name */
  const char* architecture; /* "llama" */
  const char* backend;      /* "cpu" or "cuda" */
  const char* kernels;      /* CPU kernel level in use: "avx2", "scalar", ...; "cuda" */
  /* The chat template family in use: "chatml", "llama3" or "gemma"; ""
   * when the model's template is of no known family and cb_model_options
   * named none.  Added in 0.1.x: a struct that ends before it is still filled
   * up to its end. */
  const char* chat_template;
} cb_model_info;

/* Sets info->struct_size and zeroes the rest.  NULL is ignored. */
CB_API void cb_model_info_init_sized(cb_model_info* info, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_model_info_init(cb_model_info* info) {
  cb_model_info_init_sized(info, sizeof(*info));
}
#endif

/* Fills `info` (whose struct_size the caller sets) with the model's
 * hyper-parameters and identity.  Thread-safe. */
CB_API cb_status cb_model_get_info(const cb_model* model, cb_model_info* info);

/* ------------------------------------------------------------------------ */
/* Tokens and text                                                            */
/* ------------------------------------------------------------------------ */

/* Pass as a text length to mean "the text is NUL-terminated". */
#define CB_NUL_TERMINATED ((size_t)-1)

/* Converts UTF-8 text to token ids.
 *   text, text_len  the text; text_len may be CB_NUL_TERMINATED.  Any byte
 *                   sequence is accepted (invalid UTF-8 is encoded
 *                   byte-wise).  A byte the vocabulary has no token for
 *                   becomes the model's unknown token if it has one, and is
 *                   otherwise dropped, as llama.cpp does (the default model
 *                   has no token for 21 bytes, e.g. 0x04 and 0xFF, and no
 *                   unknown token).  text may be NULL only when text_len
 *                   is 0.
 *   add_special     non-zero: add BOS/EOS as the model's metadata says.
 *   parse_special   non-zero: control-token text such as "<|im_start|>"
 *                   becomes its token (use it for chat-formatted text).
 *   tokens, capacity  the output array.
 *   n_tokens        receives the number of tokens the text needs (always set
 *                   unless the call fails for another reason).
 * Size query: with tokens == NULL and capacity == 0 the call only reports
 * *n_tokens and returns CB_OK.  Otherwise, if capacity < *n_tokens, nothing
 * is written and CB_ERR_BUFFER_TOO_SMALL is returned.  Memory: the tokens,
 * plus working space for about 1 MiB of text at a time where the text has
 * lines that end in a printable character and a next line that starts with
 * a letter (byte-level BPE models; else for the whole text).  Errors: CB_ERR_OUT_OF_MEMORY.
 * Thread-safe. */
CB_API cb_status cb_tokenize(const cb_model* model, const char* text, size_t text_len,
                             int add_special, int parse_special, int32_t* tokens, size_t capacity,
                             size_t* n_tokens);

/* Converts token ids back to UTF-8 bytes (the concatenation of the tokens'
 * pieces; it may end in an incomplete UTF-8 sequence).  Control tokens are
 * rendered as their text when render_special is non-zero, else as nothing.
 * buf receives the bytes plus a terminating NUL, so it needs *out_len + 1
 * bytes; *out_len receives the length without the NUL.  Same size-query
 * rule as cb_tokenize (buf == NULL, capacity == 0).  An id outside the
 * vocabulary gives CB_ERR_INVALID_ARGUMENT.  Thread-safe. */
CB_API cb_status cb_detokenize(const cb_model* model, const int32_t* tokens, size_t n_tokens,
                               int render_special, char* buf, size_t capacity, size_t* out_len);

/* The bytes of one token, with the same buffer rules as cb_detokenize. */
CB_API cb_status cb_token_to_piece(const cb_model* model, int32_t token, int render_special,
                                   char* buf, size_t capacity, size_t* out_len);

/* Special tokens: the id, or -1 when the model has none (or model is NULL). */
CB_API int32_t cb_token_bos(const cb_model* model);
CB_API int32_t cb_token_eos(const cb_model* model);
/* Non-zero when `token` ends a generation (EOS, end-of-turn, ...). */
CB_API int cb_token_is_end_of_generation(const cb_model* model, int32_t token);

typedef struct cb_chat_message {
  const char* role;    /* "system", "user", "assistant", ... */
  const char* content; /* NUL-terminated UTF-8 */
} cb_chat_message;

/* Formats a conversation in the model's chat template (cb_chat_template; ChatML
 * for instance gives "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
 * then "<|im_start|>assistant\n" when add_assistant_header is non-zero).  The
 * result is text to pass to cb_tokenize with parse_special set.  Buffer rules
 * as for cb_detokenize.  n_messages may be 0 (messages may then be NULL).
 * CB_ERR_UNSUPPORTED when the model's template is of no known family and
 * cb_model_options.chat_template named none.  Thread-safe. */
CB_API cb_status cb_chat_format(const cb_model* model, const cb_chat_message* messages,
                                size_t n_messages, int add_assistant_header, char* buf,
                                size_t capacity, size_t* out_len);

/* ------------------------------------------------------------------------ */
/* Session                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct cb_session cb_session;

/* The element type of a session's KV cache (cb_session_options.kv_type). */
typedef enum cb_kv_type {
  /* binary16 (default): half the memory of f32; each K/V element is rounded
   * once, to nearest, when written (logits move by ~1e-3 relative L2). */
  CB_KV_F16 = 0,
  CB_KV_F32 = 1 /* exact f32 */
} cb_kv_type;

/* How a session's weight products treat the activations
 * (cb_session_options.activations). */
typedef enum cb_activations {
  /* int8 (default): each activation row is quantized to int8 in blocks of
   * 32 and multiplied by the quantized weights in integers, as llama.cpp
   * does: decode on every CPU, and prefill where the CPU has an int8 matrix
   * product (x86: about 3x the f32 one with AVX-512 VNNI, 2x with AVX2).
   * Logits move by about 1e-2 relative L2 from the f32 path's. */
  CB_ACTIVATIONS_INT8 = 0,
  /* f32 activations everywhere: exact up to f32 rounding (logits within
   * 1e-3 of a float64 reference), at the f32 path's speed. */
  CB_ACTIVATIONS_F32 = 1
} cb_activations;

typedef struct cb_session_options {
  size_t struct_size;
  /* Context length in tokens (size of the KV cache).  0 (default): the
   * smaller of the model's training context and 4096.  Larger than the
   * training context: CB_ERR_INVALID_ARGUMENT. */
  int32_t n_ctx;
  /* Compute threads; 0 (default): the model's n_threads option; at most
   * 512.  When the system refuses to start a thread: CB_ERR_OUT_OF_MEMORY. */
  int32_t n_threads;
  /* Tokens per forward chunk during prefill and in a blend's layers
   * (bounds activation memory); 0 (default): 256 on the CPU, 2048 with
   * the CUDA backend. */
  int32_t n_batch;
  /* Unused; keeps kv_type past the end of the earlier struct (whose
   * padding it would otherwise share), so an earlier program's struct
   * reads as kv_type's default. */
  int32_t reserved0;
  /* Added after reserved0.  A cb_kv_type: CB_KV_F16 (default) or CB_KV_F32;
   * the KV cache takes n_layers x n_ctx x 2 x kv_dim x (2 or 4) bytes
   * (cb_session_kv_bytes).  Another value: CB_ERR_INVALID_ARGUMENT. */
  int32_t kv_type;
  /* Unused; keeps activations past the end of the struct that ended with
   * kv_type (whose padding it would otherwise share). */
  int32_t reserved1;
  /* Added after reserved1.  A cb_activations: CB_ACTIVATIONS_INT8 (default)
   * or CB_ACTIVATIONS_F32.  Another value: CB_ERR_INVALID_ARGUMENT. */
  int32_t activations;
  /* Added after activations.  GPU memory for retrieved chunks' KV kept
   * between requests on this session, so that a chunk an earlier request
   * read from the chunk cache is copied within the GPU instead of read and
   * sent over the bus again (cb_rag_stats.resident_hits); the copy has the
   * cache's bits.  0 (default): the backend's choice (CUDA on a discrete
   * GPU: a sixteenth of its memory, at most 4 GiB; none on the CPU, nor on
   * a GPU that shares the host's memory, such as Jetson, where nothing
   * crosses a bus); -1: none; > 0: at most that many bytes (on a discrete
   * GPU only).  Least recently used chunks make room for new ones.  Below
   * -1: CB_ERR_INVALID_ARGUMENT. */
  int64_t resident_kv_bytes;
} cb_session_options;

/* Fills `opts` with defaults.  NULL is ignored. */
CB_API void cb_session_options_init_sized(cb_session_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_session_options_init(cb_session_options* opts) {
  cb_session_options_init_sized(opts, sizeof(*opts));
}
#endif

/* Creates a session (an empty KV cache) on `model`.  `opts` may be NULL.
 * The session holds a reference to the model.  On success *out_session
 * receives the new session; free it with cb_session_free().  Errors:
 * CB_ERR_INVALID_ARGUMENT (NULL or dead model, NULL out_session, bad
 * options: struct_size, negative values, n_ctx above the training context),
 * CB_ERR_OUT_OF_MEMORY.  Thread-safe with respect to the model (many threads
 * may create sessions on one model). */
CB_API cb_status cb_session_create(cb_model* model, const cb_session_options* opts,
                                   cb_session** out_session);

/* Frees the session (and the model, if it was released and this was its last
 * session).  NULL and a handle that is not live (a second free) are
 * ignored.  Called from one of the session's own callbacks (the token
 * callback, or the abort or progress callback of any call), it makes the
 * handle dead at once; the call the callback runs in stops after the
 * callback returns, returns CB_ERR_CANCELLED and then frees the session.
 *
 * A thread that ends inside a callback (pthread_exit, cancellation) unwinds
 * through the library: the call is abandoned and the session is free for
 * other threads (reset it before further use). */
CB_API void cb_session_free(cb_session* session);

/* Appends tokens to the session's context (runs the forward pass over them).
 * n_tokens must be > 0.  If they do not fit, CB_ERR_CONTEXT_OVERFLOW is
 * returned and the session is unchanged.  An id outside the vocabulary gives
 * CB_ERR_INVALID_ARGUMENT.  The session's thread only. */
CB_API cb_status cb_session_prefill(cb_session* session, const int32_t* tokens, size_t n_tokens);

/* Number of tokens in the session's context (0 for NULL or a dead handle).
 * May be called from the session's token callback. */
CB_API int32_t cb_session_n_past(const cb_session* session);
/* The session's context length (0 for NULL or a dead handle). */
CB_API int32_t cb_session_n_ctx(const cb_session* session);
/* Bytes of the session's KV cache, allocated when it was created (K and V
 * of every layer for n_ctx positions, at the options' kv_type); 0 for NULL
 * or a dead handle. */
CB_API uint64_t cb_session_kv_bytes(const cb_session* session);
/* Forgets the whole context (n_past becomes 0); keeps the allocation.  The
 * session's thread only. */
CB_API cb_status cb_session_reset(cb_session* session);

/* Cancelling long work.  A session's abort callback is asked before every
 * step of its forward passes (each matrix product, attention, ...; several
 * times per layer) in cb_session_prefill, the prompt of cb_generate,
 * cb_rag_prefill and cb_chunk_cache_add, and before each token that
 * cb_generate decodes.  Non-zero stops the call with CB_ERR_CANCELLED:
 *   - cb_session_prefill, or cb_generate's prompt: the session is left as
 *     before the call (same n_past, same logits);
 *   - cb_generate while decoding: as when the token callback cancels (the
 *     tokens reported so far are in the session, stop_reason
 *     CB_STOP_CANCELLED);
 *   - cb_rag_prefill, cb_chunk_cache_add: the session is left empty; chunks
 *     whose KV was complete are kept in the cache, none half-computed.
 * The callback runs on the thread that made the call and must not call the
 * library with this session (cb_session_free excepted: see there); typically
 * it reads a flag that another thread
 * or a signal handler sets, so a request stops within one step's time (tens
 * of milliseconds on a phone-sized model).  NULL removes it.  The session's
 * thread only.  Errors: CB_ERR_INVALID_ARGUMENT (NULL or dead session). */
typedef int (*cb_abort_callback)(void* user_data);
CB_API cb_status cb_session_set_abort_callback(cb_session* session, cb_abort_callback callback,
                                               void* user_data);

/* Progress of long work, for a progress bar.  A session's progress callback
 * is told how far a call on the session has come, in stages:
 *   - CB_PROGRESS_PREFILL, in tokens: cb_session_prefill, cb_session_embed,
 *     the prompt of cb_generate and cb_rag_prefill in CB_MODE_FULL, after
 *     each forward batch (cb_session_options.n_batch tokens);
 *   - CB_PROGRESS_CHUNK, in layers: a chunk's KV computed for the chunk
 *     cache, by cb_chunk_cache_add or by cb_rag_prefill for a chunk the
 *     cache does not hold, after each layer (once per such chunk);
 *   - CB_PROGRESS_BLEND, in layers: cb_rag_prefill's passes over the
 *     request that reuse the chunks' KV, after each layer: n_layer for one
 *     pass, 2 x n_layer where the selection ranks the tokens in a pass of
 *     its own first (CB_SELECT_LOOKAHEAD, the default).  A chunk whose
 *     stored KV cannot be read is computed and the passes run again,
 *     counted from 1 again.
 * Within a stage `done` goes from 1 to `total`.  Non-zero stops the call
 * with CB_ERR_CANCELLED, leaving the session as the abort callback does
 * (see there).  The callback runs on the thread that made the call and must
 * not call the library with this session (cb_session_free excepted: see
 * there).  NULL removes it.  The session's thread only.  Errors:
 * CB_ERR_INVALID_ARGUMENT (NULL or dead session). */
typedef enum cb_progress_stage {
  CB_PROGRESS_PREFILL = 0,
  CB_PROGRESS_CHUNK = 1,
  CB_PROGRESS_BLEND = 2
} cb_progress_stage;
typedef int (*cb_progress_callback)(cb_progress_stage stage, int32_t done, int32_t total,
                                    void* user_data);
CB_API cb_status cb_session_set_progress_callback(cb_session* session,
                                                  cb_progress_callback callback, void* user_data);

/* The logits of the last token in the session's KV cache (n_vocab floats),
 * available after cb_session_prefill(), after cb_rag_prefill() and after a
 * cb_generate() whose last token entered the KV cache (max_tokens 0, an
 * end-of-generation stop, a full context).  When none are available (empty
 * session, or the last generated token is still pending: see cb_generate)
 * the call gives CB_ERR_INVALID_ARGUMENT.
 * *logits points into the session: valid until the next call on the
 * session.  The session's thread only. */
CB_API cb_status cb_session_logits(const cb_session* session, const float** logits,
                                   size_t* n_vocab);

/* A text's embedding, for retrieval by similarity: the mean over its tokens
 * of the model's last hidden state (after the output norm), scaled to unit
 * length, so the dot product of two embeddings is their cosine.  Writes
 * n_embd floats (cb_model_info) to out; capacity is out's length in floats
 * (less than n_embd: CB_ERR_BUFFER_TOO_SMALL).  The tokens run as a
 * sequence of their own from position 0 in the session's KV cache: the
 * session's context and logits are discarded, and it is empty afterwards,
 * whatever the outcome.  A decoder model's pooled states are no trained
 * sentence embedding: measure them on your retrieval task before relying on
 * them.  Errors: as cb_session_prefill
 * (n_tokens 0 or an id outside the vocabulary: CB_ERR_INVALID_ARGUMENT;
 * more tokens than n_ctx: CB_ERR_CONTEXT_OVERFLOW; the abort or progress
 * callback: CB_ERR_CANCELLED).  The session's thread only. */
CB_API cb_status cb_session_embed(cb_session* session, const int32_t* tokens, size_t n_tokens,
                                  float* out, size_t capacity);

/* ------------------------------------------------------------------------ */
/* Sampling and generation                                                    */
/* ------------------------------------------------------------------------ */

typedef struct cb_sampling_options {
  size_t struct_size;
  float temperature; /* <= 0 (default 0): greedy, the most likely token */
  int32_t top_k;     /* <= 0 (default): no top-k cut */
  float top_p;       /* in (0, 1]; 1 (default): no nucleus cut */
  uint64_t seed;     /* random seed (default 0); same seed, same output */
  /* Added in 0.1.x: a struct that ends before them gets their defaults. */
  /* Sampling only: drop the tokens less likely than min_p times the most
   * likely one; in [0, 1), 0 (default): no cut. */
  float min_p;
  /* Greedy and sampled: each distinct token among the last repeat_last_n
   * tokens this call generated has its logit divided by repeat_penalty
   * when positive, multiplied when negative.  > 0; 1 (default): none (1.1
   * to 1.3 breaks the loops a small model falls into).  repeat_last_n >= 0
   * (default 64). */
  float repeat_penalty;
  int32_t repeat_last_n;
} cb_sampling_options;

/* Fills `opts` with defaults (greedy).  NULL is ignored. */
CB_API void cb_sampling_options_init_sized(cb_sampling_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_sampling_options_init(cb_sampling_options* opts) {
  cb_sampling_options_init_sized(opts, sizeof(*opts));
}
#endif

typedef struct cb_generate_options {
  size_t struct_size;
  int32_t max_tokens; /* tokens to generate at most (default 256); 0: prefill only */
  /* Non-zero (default 1): stop at the model's end-of-generation tokens
   * (EOS, end of turn); that token is neither reported nor kept. */
  int32_t stop_at_end_of_generation;
  /* Sampling; NULL (default) means greedy.  Read during the call only. */
  const cb_sampling_options* sampling;
  /* Added in 0.1.x (a struct that ends before them has no stop strings).
   * Generation stops where the generated text first contains one of these
   * n_stop_strings non-empty UTF-8 strings (NULL, 0 by default; read during
   * the call only), with CB_STOP_STRING.  The callback never sees a stop
   * string or a part of one: a token whose text could begin one is
   * reported once the next tokens rule it out, and the token in which a
   * stop string begins is reported with its piece cut where the string
   * starts (not at all when nothing precedes it there).  The stop string's
   * tokens stay in the session's context. */
  const char* const* stop_strings;
  size_t n_stop_strings;
} cb_generate_options;

/* Fills `opts` with defaults.  NULL is ignored. */
CB_API void cb_generate_options_init_sized(cb_generate_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_generate_options_init(cb_generate_options* opts) {
  cb_generate_options_init_sized(opts, sizeof(*opts));
}
#endif

/* Called once per generated token, on the thread that called cb_generate.
 * `piece` holds the token's bytes (piece_len of them, followed by a NUL); it
 * may be an incomplete UTF-8 sequence that later pieces complete, and is
 * valid only during the call.  Return 0 to continue, non-zero to stop:
 * cb_generate then returns CB_ERR_CANCELLED (the token just reported is kept
 * in the session).  The callback must not use the same session: such calls
 * give CB_ERR_INVALID_ARGUMENT (cb_session_n_past/n_ctx excepted), and
 * cb_session_free is deferred until cb_generate returns (see there).  Other
 * sessions, models and caches may be used from the callback. */
typedef int (*cb_token_callback)(int32_t token, const char* piece, size_t piece_len,
                                 void* user_data);

typedef enum cb_stop_reason {
  CB_STOP_NONE = 0,              /* an error before generation started */
  CB_STOP_MAX_TOKENS = 1,        /* max_tokens were generated */
  CB_STOP_END_OF_GENERATION = 2, /* the model produced an end-of-generation token */
  CB_STOP_CONTEXT_FULL = 3,      /* the session's context is full */
  CB_STOP_CANCELLED = 4,         /* the callback returned non-zero */
  CB_STOP_STRING = 5             /* the text reached one of the stop strings */
} cb_stop_reason;

typedef struct cb_generate_stats {
  size_t struct_size;  /* set by the caller (cb_generate_stats_init) */
  int32_t n_prompt;    /* prompt tokens processed by this call */
  int32_t n_generated; /* tokens reported to the callback */
  /* Time to the first generated token.  A call with an empty prompt that
   * continues from cb_session_prefill or cb_rag_prefill counts that call's
   * time too (it is then in prefill_ms), so after a RAG prefill this is the
   * request's time to first token. */
  double ttft_ms;
  double prefill_ms; /* the forward pass over the prompt (or that earlier call) */
  double decode_ms;  /* forward passes over generated tokens, plus sampling */
  double tok_s;      /* decode speed: generated-token forward passes per second */
  cb_stop_reason stop_reason;
} cb_generate_stats;

/* Sets stats->struct_size and zeroes the rest.  NULL is ignored. */
CB_API void cb_generate_stats_init_sized(cb_generate_stats* stats, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_generate_stats_init(cb_generate_stats* stats) {
  cb_generate_stats_init_sized(stats, sizeof(*stats));
}
#endif

/* Appends `prompt` to the session and generates up to max_tokens tokens,
 * reporting each to `callback` (may be NULL) as it is chosen.
 *   prompt, n_prompt  may be empty (NULL, 0) when the session already holds
 *                     tokens: generation then continues from them.
 *   opts              may be NULL for defaults.
 *   stats             may be NULL; otherwise filled (struct_size set by the
 *                     caller) on success and on CB_ERR_CANCELLED.
 * The session then holds the prompt and every reported token, so a later
 * call continues the conversation.  (The last reported token enters the KV
 * cache at the start of the next prefill/generate call; cb_session_n_past
 * already counts it.)  Generation stops early, with CB_OK, when the context
 * is full.  A prompt that does not fit gives CB_ERR_CONTEXT_OVERFLOW and
 * leaves the session unchanged.  Logits that are NaN or +inf (a model with
 * non-finite weights) give CB_ERR_FORMAT.  The session's thread only. */
CB_API cb_status cb_generate(cb_session* session, const int32_t* prompt, size_t n_prompt,
                             const cb_generate_options* opts, cb_token_callback callback,
                             void* user_data, cb_generate_stats* stats);

/* ------------------------------------------------------------------------ */
/* Retrieval-augmented prefill (CacheBlend)                                   */
/* ------------------------------------------------------------------------ */

/* A cache of text chunks' KV (the precomputed keys and values of each chunk,
 * prefilled on its own after a fixed chunk head): in RAM in float32
 * (cb_chunk_cache_create(); it grows until cleared), or on flash, encoded,
 * within a capacity, least recently used entries going first, with optional
 * tiers around it (cb_chunk_cache_open()).  Entries are keyed by the model's
 * fingerprint, the chunk head, the chunk's token ids and a namespace, so one
 * cache may serve several models and never serves one namespace's chunks to
 * another.  Thread-safe: any number of sessions, on any threads, may
 * use one cache at the same time, and the stats/clear functions may be
 * called concurrently with them (an entry in use by a request stays valid
 * for that request even if cleared meanwhile). */
typedef struct cb_chunk_cache cb_chunk_cache;

/* Creates an empty cache; free it with cb_chunk_cache_free().  Errors:
 * CB_ERR_INVALID_ARGUMENT (NULL out_cache), CB_ERR_OUT_OF_MEMORY. */
CB_API cb_status cb_chunk_cache_create(cb_chunk_cache** out_cache);

/* Frees the cache: a cache in RAM drops its entries, a cache on flash first
 * waits for pending write-backs (the entries stay on flash).  NULL and a
 * handle that is not live (a second free) are ignored.  Must not race with
 * other calls that use the same cache. */
CB_API void cb_chunk_cache_free(cb_chunk_cache* cache);

/* How a chunk cache on flash encodes KV (recorded per entry). */
typedef enum cb_codec {
  CB_CODEC_F16 = 1, /* binary16: exact up to f16 rounding; 2 bytes per value */
  CB_CODEC_Q8 = 2,  /* int8 per (token, head) with a scale, then zstd: ~0.46x of f16 */
  CB_CODEC_Q4 = 3   /* 4-bit: K per channel, V per (token, head), then zstd: ~0.29x of f16 */
} cb_codec;

typedef struct cb_store_options {
  size_t struct_size;
  uint64_t capacity_bytes;     /* default 4 GiB; least recently used entries go first */
  cb_codec codec;              /* default CB_CODEC_Q8 */
  uint64_t read_bytes_per_sec; /* 0 (default): no cap; else emulates slow flash */
  int32_t busy_timeout_ms;     /* default 5000: waiting on another process's lock */
  /* For auto_ratio: the read speed (bytes per second) the loading controller
   * assumes for this store instead of measuring it; requests do not refresh
   * it, and it is kept in DIR/calibration.sqlite as an override until a
   * cache is opened with 0 here.  0 (default): measured on this device. */
  double assumed_read_bytes_per_sec;
  /* Storage tiers around the store on flash, all off by default (fields
   * added after assumed_read_bytes_per_sec: a program built with an earlier
   * header passes a shorter struct and gets none).  With tiers, a chunk is
   * read from the fastest tier holding it, a chunk read in full from a
   * slower tier is copied to the nearest faster one, and new chunks go to the cheapest
   * tier whose loads a blend at `placement_ratio` still hides (the fastest
   * when none does) and move down as the RAM budget overflows (least
   * recently used first).  The Redis tier is shared: every new chunk is also
   * written there, so other processes and devices find it.  The strings are
   * copied by cb_chunk_cache_open. */
  uint64_t ram_budget_bytes;        /* > 0: a RAM tier of this many bytes (f32 KV) before flash */
  const char* slow_dir;             /* a slower directory after flash (an SD card); NULL: none */
  uint64_t slow_read_bytes_per_sec; /* that directory's read cap; 0: none */
  /* A Redis or Valkey server as the last tier: "host:port" or
   * "redis://[[user]:password@]host[:port][/db]" (its errors show the user
   * and password as "***").  No TLS.  NULL: none.  A server that is down,
   * slow, full or answers errors makes misses, never errors; a write it
   * refuses keeps the chunk in a local tier (counted in the tier's
   * failures).  Each command waits at most redis_timeout_ms in all, less
   * when the session's abort callback stops the request.  A value whose
   * shape is not the one its chunk and model imply is a miss, from any
   * tier. */
  const char* redis_address;
  const char* redis_password; /* NULL: the address's, if any */
  const char* redis_username; /* ACL user; NULL: the address's, or the default user */
  int32_t redis_timeout_ms;   /* connect and command timeout; default 1000 */
  /* The recompute ratio, in [0, 1], that placement plans for (default: the
   * default cb_rag_options.ratio, 0.2).  Placement predicts with the model's
   * compute cost on this device, measured by a short probe in the caller's
   * session the first time a model stores a chunk (kept in
   * DIR/calibration.sqlite, as auto_ratio's).  Added after
   * redis_timeout_ms: a struct that ends before it gets the default. */
  float placement_ratio;
} cb_store_options;

/* Sets opts->struct_size and the defaults.  NULL is ignored. */
CB_API void cb_store_options_init_sized(cb_store_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_store_options_init(cb_store_options* opts) {
  cb_store_options_init_sized(opts, sizeof(*opts));
}
#endif

/* Opens the chunk cache kept on flash in directory `dir` (created if needed):
 * an SQLite index plus one blob per chunk, one compressed segment per layer,
 * checksummed.  New chunks are written back asynchronously; a damaged or
 * missing blob is a miss and its chunk is computed again.  Several processes
 * may open one directory.  Free with cb_chunk_cache_free() (which waits for
 * pending writes).  On error *out_cache is set to NULL.
 *
 * Degraded storage opens with a report (cb_chunk_cache_open_report) instead
 * of failing: a `dir` holding a store that cannot be written (a full disk, a
 * read-only file system, another user's files) is opened read-only, its
 * chunks served and new ones not stored (stats.read_only); a slow_dir that
 * cannot be used (not a directory, not writable) is skipped
 * (stats.unavailable_tiers); a damaged index is moved aside and rebuilt
 * empty; blobs the index does not list (another store's index or -wal
 * copied in) are moved to DIR/quarantine/ (stats.quarantined).
 *
 * Errors: CB_ERR_INVALID_ARGUMENT (NULLs, bad options), CB_ERR_IO (cannot
 * create or lock the directory, nor read a store there), CB_ERR_FORMAT (a
 * damaged index that cannot be rebuilt).  Thread-safe. */
CB_API cb_status cb_chunk_cache_open(const char* dir, const cb_store_options* opts,
                                     cb_chunk_cache** out_cache);

/* What cb_chunk_cache_open found that a user should hear about, one line per
 * finding, each ending in '\n': the store opened read-only and why, a
 * damaged index rebuilt empty and why, chunks quarantined (how many, where,
 * how to get them back), tiers skipped and why.  Empty when there was
 * nothing.  buf receives the text plus a terminating NUL, so it needs
 * *out_len + 1 bytes; *out_len receives the length without the NUL (buf
 * NULL and capacity 0: the length only).
 * Errors: CB_ERR_INVALID_ARGUMENT (NULLs), CB_ERR_BUFFER_TOO_SMALL.
 * Thread-safe. */
CB_API cb_status cb_chunk_cache_open_report(const cb_chunk_cache* cache, char* buf, size_t capacity,
                                            size_t* out_len);

/* Waits until every chunk queued for write-back is on flash.  A no-op for a
 * cache in RAM.  Thread-safe. */
CB_API cb_status cb_chunk_cache_flush(cb_chunk_cache* cache);

typedef struct cb_chunk_cache_stats {
  size_t struct_size;     /* set by the caller (cb_chunk_cache_stats_init) */
  uint64_t n_entries;     /* chunks held */
  uint64_t bytes;         /* bytes of KV held (encoded size on flash) */
  uint64_t hits;          /* flash only: lookups that found the chunk */
  uint64_t misses;        /* flash only: lookups that did not */
  uint64_t evictions;     /* flash only: entries removed for capacity */
  uint64_t corrupt_drops; /* flash only: damaged entries found and removed */
  uint64_t bytes_read;    /* flash only: bytes read from blobs */
  /* Added after bytes_read (a shorter struct gets none of them): */
  uint64_t quarantined;       /* flash only: chunks the open moved to DIR/quarantine/ (their
                               * blobs were not in the index; cb_chunk_cache_open_report) */
  uint32_t unavailable_tiers; /* configured tiers the open skipped (a slow_dir it could not use) */
  int32_t read_only;          /* flash only: 1 when DIR could not be written and was opened
                               * read-only (new chunks are not stored), else 0 */
} cb_chunk_cache_stats;

/* Sets stats->struct_size and zeroes the rest.  NULL is ignored. */
CB_API void cb_chunk_cache_stats_init_sized(cb_chunk_cache_stats* stats, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_chunk_cache_stats_init(cb_chunk_cache_stats* stats) {
  cb_chunk_cache_stats_init_sized(stats, sizeof(*stats));
}
#endif

/* Fills `stats` (whose struct_size the caller sets).  Thread-safe. */
CB_API cb_status cb_chunk_cache_get_stats(const cb_chunk_cache* cache, cb_chunk_cache_stats* stats);

/* One storage tier's counters since the cache was opened. */
typedef struct cb_tier_stats {
  size_t struct_size;     /* set by the caller (cb_tier_stats_init) */
  const char* name;       /* "ram", "flash", "slow" or "redis"; static */
  uint64_t hits;          /* lookups this tier served */
  uint64_t misses;        /* lookups that reached this tier and did not find the chunk */
  uint64_t bytes_read;    /* stored bytes of the layers read from this tier */
  uint64_t read_failures; /* layer reads that failed (the chunk was computed instead) */
  uint64_t placed;        /* new chunks stored here (redis: also those stored above it) */
  uint64_t promoted_in;   /* chunks copied here from the tier below after a full read */
  uint64_t demoted_in;    /* chunks moved here from the tier above (RAM budget) */
  uint64_t failures;      /* lookups and stores that failed in this tier */
  uint64_t budget_bytes;  /* ram: decoded bytes held against ram_budget_bytes; else 0 */
} cb_tier_stats;

/* Sets stats->struct_size and zeroes the rest.  NULL is ignored. */
CB_API void cb_tier_stats_init_sized(cb_tier_stats* stats, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_tier_stats_init(cb_tier_stats* stats) {
  cb_tier_stats_init_sized(stats, sizeof(*stats));
}
#endif

/* The number of storage tiers, fastest first: with tiers (cb_store_options)
 * ram (if budgeted), flash, slow (if any), redis (if any); a cache on flash
 * without tiers has one, "flash"; a cache in RAM (cb_chunk_cache_create)
 * none.  Writes *out_n_tiers.  Thread-safe. */
CB_API cb_status cb_chunk_cache_n_tiers(const cb_chunk_cache* cache, size_t* out_n_tiers);

/* Fills `stats` (whose struct_size the caller sets) with tier `tier`'s
 * counters (0 = fastest).  Errors: CB_ERR_INVALID_ARGUMENT (NULLs, an
 * unknown struct_size, tier >= the number of tiers).  Thread-safe. */
CB_API cb_status cb_chunk_cache_get_tier_stats(const cb_chunk_cache* cache, size_t tier,
                                               cb_tier_stats* stats);

/* Removes every entry this cache holds itself: in RAM, on flash, in the slow
 * directory.  A Redis tier is not cleared: its values are shared with every
 * process and device that reaches the server (other namespaces and models
 * included) and leave by the server's eviction policy or TTL;
 * cb_chunk_cache_remove removes one chunk there too.  Thread-safe. */
CB_API cb_status cb_chunk_cache_clear(cb_chunk_cache* cache);

/* How a request's KV cache is built. */
typedef enum cb_mode {
  CB_MODE_FULL = 0,   /* plain prefill of every token: exact, slowest; needs no cache */
  CB_MODE_PREFIX = 1, /* reuse the first chunk's cached KV (exact, with the PROMPT head);
                       * compute the rest */
  CB_MODE_REUSE = 2,  /* reuse every chunk's cached KV, re-positioned; compute only the
                       * prompt head and the question: fastest, no cross-attention */
  CB_MODE_BLEND = 3   /* CacheBlend: reuse every chunk and recompute the tokens whose
                       * KV deviates most (a `ratio` of them) from the check layer on */
} cb_mode;

/* The mode's name: "full", "prefix", "reuse", "blend"; "unknown" for other
 * values.  Static.  Thread-safe. */
CB_API const char* cb_mode_name(cb_mode mode);

/* What each chunk's KV is precomputed after (part of the cache key). */
typedef enum cb_chunk_head {
  CB_CHUNK_HEAD_PROMPT = 0, /* the request's prompt head (system turn + start of the
                             * user turn); default */
  CB_CHUNK_HEAD_NONE = 1    /* nothing: the chunk alone from position 0 */
} cb_chunk_head;

/* A check layer of selective recompute: at `layer` the KV deviation of the
 * reused tokens still being computed is measured and the top `ratio` of all
 * reused tokens (a fraction in [0, 1]) are kept for the later layers.
 * Layers before the first check layer are computed for every token. */
typedef struct cb_check_layer {
  int32_t layer;
  float ratio;
} cb_check_layer;

/* Which reused tokens BLEND recomputes: how the tokens are ranked at the
 * first check layer (later check layers of a schedule narrow the set by
 * the KV deviation of V, as CacheBlend does).  Every policy keeps the
 * same count of tokens, so they compare at equal cost. */
typedef enum cb_select {
  CB_SELECT_DEFAULT = 0,   /* the library's default policy: LOOKAHEAD */
  CB_SELECT_HKVD = 1,      /* CacheBlend: deviation of fresh from cached V at the check layer */
  CB_SELECT_HKVD_KV = 2,   /* deviation of K and V, each head's share normalised */
  CB_SELECT_ATTENTION = 3, /* what each token adds to the question's attention output
                            * (weight x value norm) at the check layer */
  CB_SELECT_LOOKAHEAD = 4  /* a reuse pass first (about the cost of REUSE), then that
                            * contribution summed over every layer; the best measured
                            * (docs/FIDELITY.md) */
  /* 5 to 7: the study-only baselines and oracles of
   * cacheblend/cacheblend_experimental.h. */
} cb_select;

/* The policy's name: "hkvd", "hkvd_kv", "attention", "lookahead", and for the
 * experimental ones "random", "oracle", "oracle_kl"; CB_SELECT_DEFAULT names the
 * policy it stands for; "unknown" for other values.  Static.  Thread-safe. */
CB_API const char* cb_select_name(cb_select select);

typedef struct cb_rag_options {
  size_t struct_size;
  cb_mode mode; /* default CB_MODE_BLEND */
  /* Recompute ratio in [0, 1] (default 0.2) for BLEND when no schedule is
   * given: the schedule is then one check, at layer 0 for the LOOKAHEAD
   * policy and the experimental RANDOM and ORACLE (their ranking is known
   * before the pass) and at layer 1 for the others.  Checked in every
   * mode. */
  float ratio;
  /* Optional check-layer schedule (gradual filtering), e.g.
   * [(1, 0.30), (3, 0.15)]: layers strictly increasing and existing in the
   * model, ratios in [0, 1] and not increasing.  NULL / 0 (default): use
   * `ratio`.  Read during the call only. */
  const cb_check_layer* schedule;
  size_t n_schedule;
  cb_chunk_head chunk_head; /* default CB_CHUNK_HEAD_PROMPT */
  /* The system turn's text; NULL (default): "Answer the question using the
   * documents."  Part of the prompt head, hence of the cache key with the
   * PROMPT chunk head. */
  const char* system_prompt;
  /* Cache namespace; NULL (default) or "": the default namespace. */
  const char* cache_namespace;
  /* 1 (default): a loader thread reads and decodes layer i+1 of the cached
   * chunks while layer i computes; 0: the same work, one after the other.
   * Results are identical either way. */
  int32_t pipeline;
  /* 1: BLEND only, with a chunk cache on flash: the loading controller
   * picks the ratio so that recompute time just fits inside the time to
   * load the chunks, never below `ratio` (the quality floor; default
   * 0.2).  With CB_SELECT_LOOKAHEAD the loads end in its reuse pass, before
   * any recompute, so nothing can hide them: the ratio stays at the floor.  Its cost models are
   * measured on this device: a short compute probe at first use; the store's read speed (unless the
   * caller set cb_store_options.assumed_read_bytes_per_sec) and decode cost from the first request
   * that reads it (which runs at the floor); all saved in DIR/calibration.sqlite and refreshed from
   * every request's timings. When reading the chunks would take longer than recomputing every
   * token, nothing is read and the request is a full prefill (ratio 1,
   * bytes_read 0).  A schedule's check layers are kept; its last ratio is
   * the controller's.  0 (default): use `ratio` / `schedule`.  Requests
   * with auto_ratio on one cache are serialized. */
  int32_t auto_ratio;
  /* The ranking of tokens to recompute (BLEND); default CB_SELECT_DEFAULT
   * (LOOKAHEAD).  Added after auto_ratio, like the fields below: a struct
   * that ends before them is still accepted and gets their defaults. */
  cb_select select;
  /* The first `sink_tokens` tokens of every chunk are always recomputed, on
   * top of the ratio's count (EPIC's attention-sink fix); default 0. */
  int32_t sink_tokens;
  /* Seed of the experimental CB_SELECT_RANDOM; default 0. */
  uint64_t seed;
  /* Quality guard (BLEND): when the tokens selected at the first check
   * layer hold less than `guard_share` of the policy's total score (its
   * deviation or attention mass over all reused tokens), more tokens are
   * added, best first, until they do or the ratio reaches
   * `guard_max_ratio`; cb_rag_stats.ratio then reports the raised ratio.
   * guard_share in [0, 1]: 0 turns the guard off (default 0). */
  float guard_share;
  /* The guard's ceiling on the ratio, in [0, 1] (default 0.5): the bound
   * on the extra time to first token the caller accepts. */
  float guard_max_ratio;
  /* 1 (default): BLEND shifts, at every layer, the KV of each chunk's
   * tokens that are not recomputed by the mean correction (fresh minus
   * cached K before RoPE, and V) of the chunk's tokens that are: much of
   * what a chunk's KV lacks without the chunks before it is shared by all
   * of its tokens.  No extra token is computed.  0: the reused KV as
   * stored.  Added after guard_max_ratio: a struct that ends before it
   * gets the default. */
  int32_t chunk_shift;
  /* With chunk_shift, the share of the first check's recomputed count,
   * in [0, 1] (default 0.25), that goes to tokens spread evenly over the
   * reused ones, the policy choosing the rest; each chunk's correction is
   * the mean over these probes (over all its recomputed tokens when it has
   * fewer than two).  The policy's tokens are picked for what they matter
   * to the answer and their corrections differ from those of the tokens it
   * leaves; evenly spread ones are a fair sample.  0: no probes.  Added
   * after chunk_shift: a struct that ends before it gets the default. */
  float shift_probes;
  /* With chunk_shift, a span length in tokens, in [0, 1048576] (default
   * 128): each chunk is also cut into equal spans of about this many tokens
   * (as many as leave two or more of the tokens its correction is measured
   * on in each), and a token that is not recomputed takes half its
   * chunk's mean correction and half its span's, since what a chunk lacks
   * drifts along it.  No extra token is computed.  0: the chunk's mean
   * alone.  Added after shift_probes: a struct that ends before it gets
   * the default. */
  int32_t shift_span;
  /* Threads that read and decode a layer of the cached chunks at once, each
   * a share of the chunks (with `pipeline` on; the loader thread is one of
   * them), in [0, 64].  0 (default): one on the CPU, whose cores the
   * computation uses, and up to 4 (half the hardware threads) on a discrete
   * GPU, where the cores are idle and the loads wait on the host copying
   * and decoding the chunks.  Results are identical for any count.  Added
   * after shift_span: a struct that ends before it gets the default. */
  int32_t fetch_threads;
} cb_rag_options;

/* Fills `opts` with defaults.  NULL is ignored. */
CB_API void cb_rag_options_init_sized(cb_rag_options* opts, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_rag_options_init(cb_rag_options* opts) {
  cb_rag_options_init_sized(opts, sizeof(*opts));
}
#endif

typedef struct cb_rag_stats {
  size_t struct_size;        /* set by the caller (cb_rag_stats_init) */
  int32_t n_tokens;          /* tokens in the request (head + chunks + question) */
  int32_t n_reused;          /* tokens whose cached KV was used */
  int32_t cache_hits;        /* chunks whose KV was read from the cache */
  int32_t cache_misses;      /* chunks computed by this call: absent (then stored),
                              * or unreadable (counted in chunks_recomputed too) */
  int32_t chunks_recomputed; /* cached chunks that could not be read and were computed */
  double precompute_ms;      /* computing the missing chunks' KV */
  double fuse_ms;            /* building the request's KV and last logits */
  double total_ms;           /* the whole call */
  /* Fraction of a full prefill's per-layer token work that the fusion did
   * (1 for FULL). */
  double computed_fraction;
  /* The recompute ratio used at the first check layer: 1 for FULL, 0 for
   * PREFIX and REUSE (no selective recompute), the schedule's first ratio
   * for BLEND (the controller's choice with auto_ratio). */
  float ratio;
  int32_t pipelined;   /* 1 if loads overlapped compute */
  uint64_t bytes_read; /* stored bytes of cached KV layers loaded */
  double load_ms;      /* loader busy time: read + decode (summed over the fetch
                        * threads) + RoPE of cached K */
  double blocked_ms;   /* compute waiting for loads (serial: all of load_ms) */
  double recompute_ms; /* computing layers, waits excluded */
  /* Copying the loaded KV into the GPU's memory, as the backend timed it
   * (CUDA events on the streams of the threads that read the chunks,
   * summed over them; it overlaps load_ms and the compute).  0 on the CPU
   * and on GPUs that share the host's memory (Jetson), where loads are
   * written in place.  Added in 0.1.x: a struct that ends before it (older
   * callers) is still accepted. */
  double upload_ms;
  /* The share of the selection policy's total score that the tokens kept
   * at the first check layer hold (BLEND; 1 when every reused token is
   * kept, 0 in other modes), and whether the quality guard raised the
   * ratio to reach cb_rag_options.guard_share.  Added after upload_ms: a
   * struct that ends before them is still accepted. */
  double selected_share;
  int32_t guard_raised;
  /* The read and decode part of load_ms (the rest is rotating K), summed
   * over cb_rag_options.fetch_threads; on a discrete GPU it includes
   * writing the chunks into the staging memory the copies read.  Added
   * after guard_raised: a struct that ends before it is still accepted. */
  double fetch_ms;
  /* Of cache_hits, the chunks copied from the session's GPU memory
   * (cb_session_options.resident_kv_bytes) instead of read from the cache
   * (not in bytes_read), and the bytes copied so.  Added after fetch_ms: a
   * struct that ends before them is still accepted. */
  int32_t resident_hits;
  uint64_t resident_bytes;
} cb_rag_stats;

/* Sets stats->struct_size and zeroes the rest.  NULL is ignored. */
CB_API void cb_rag_stats_init_sized(cb_rag_stats* stats, size_t struct_size);
#ifndef CB_BUILDING_LIBRARY
static inline void cb_rag_stats_init(cb_rag_stats* stats) {
  cb_rag_stats_init_sized(stats, sizeof(*stats));
}
#endif

/* Prefills the empty `session` with a retrieval-augmented request, in the
 * model's chat template (cb_chat_template); with ChatML:
 *   [system turn + "<|im_start|>user\n"] + chunk_1 + ... + chunk_N +
 *   ["Question: " question "<|im_end|>\n<|im_start|>assistant\n"]
 * (each chunk is its text followed by a blank line, tokenized on its own;
 * text in chunks and question is never parsed as control tokens).  Gemma
 * has no system turn: the system prompt opens the user turn.
 * CB_ERR_UNSUPPORTED when the model's template is of no known family and
 * cb_model_options.chat_template named none.
 * Chunks missing from `cache` are computed and stored first (in modes other
 * than FULL); then the request's KV is built as `opts->mode` says.
 *   session     must be empty (a new session or one after cb_session_reset).
 *   cache       the chunk cache; may be NULL only in CB_MODE_FULL.
 *   chunk_texts n_chunks >= 1 NUL-terminated UTF-8 strings (any bytes are
 *               accepted; invalid UTF-8 is tokenized byte-wise).  A request
 *               without documents is not a RAG request: use cb_generate().
 *   question    NUL-terminated UTF-8.
 *   opts        may be NULL for defaults (BLEND, LOOKAHEAD selection, ratio 0.2).
 *   stats       may be NULL; otherwise filled on success.
 * Afterwards the session holds the request (cb_session_n_past() is its
 * length), cb_session_logits() gives the last position's logits, and
 * cb_generate(session, NULL, 0, ...) generates the answer from them without
 * running anything again.
 * Errors: CB_ERR_INVALID_ARGUMENT (NULL arguments, no chunks, a session that
 * is not empty, bad options: unknown mode or chunk head, ratio outside
 * [0, 1], a schedule naming a layer the model lacks, NULL cache outside
 * FULL), CB_ERR_CONTEXT_OVERFLOW (a chunk or the whole request longer than
 * the session's context), CB_ERR_FORMAT (logits that are NaN or +inf, as in
 * cb_generate: a model with non-finite weights).  On error the session is
 * left empty (chunks
 * computed before the error may remain in the cache).  The session's thread
 * only; the cache may be shared with other threads. */
CB_API cb_status cb_rag_prefill(cb_session* session, cb_chunk_cache* cache,
                                const char* const* chunk_texts, size_t n_chunks,
                                const char* question, const cb_rag_options* opts,
                                cb_rag_stats* stats);

/* ------------------------------------------------------------------------ */
/* Precomputing chunks (a RAG app's ingest step)                             */
/* ------------------------------------------------------------------------ */

/* Computes the KV of one chunk of text exactly as cb_rag_prefill would
 * (same tokenization: the text followed by a blank line, never parsed as
 * control tokens; same chunk head from opts->chunk_head and
 * opts->system_prompt; same cache key, cache_namespace included) and stores
 * it in `cache` unless it is already there, so that a later cb_rag_prefill
 * with the same options finds it (a cache hit).
 *   session      must be empty (as for cb_rag_prefill); it is used as
 *                scratch space for the forward pass and is left empty.  Its
 *                model is the one the KV is computed with.
 *   cache        a cache in RAM or on flash.  On flash the entry is written
 *                before the call returns (not queued for write-back), so it
 *                is on flash and found by cb_chunk_cache_contains at once.
 *   chunk_text   NUL-terminated UTF-8 (any bytes are accepted).
 *   opts         may be NULL for defaults; only chunk_head, system_prompt
 *                and cache_namespace are read (struct_size is checked).
 *   out_computed may be NULL; receives 1 if the chunk was computed and
 *                stored by this call, 0 if it was already cached.
 *   out_n_tokens may be NULL; receives the chunk's token count (its length
 *                in a request, the chunk head excluded).
 * The check and the store are not one atomic step: two threads adding the
 * same chunk at the same time may both compute it (and both report 1); the
 * cache keeps one entry.  For a cache on flash the lookup
 * counts in the cache's hits/misses stats and a found entry becomes the most
 * recently used.
 * Errors: CB_ERR_INVALID_ARGUMENT (NULL session/cache/chunk_text, a session
 * that is not empty, bad struct_size or chunk_head), CB_ERR_CONTEXT_OVERFLOW
 * (the chunk plus its chunk head is longer than the session's context),
 * CB_ERR_IO (a cache on flash could not write the entry: disk full, or the
 * entry is larger than the cache's capacity), CB_ERR_UNSUPPORTED (the KV
 * holds values the flash cache's codec cannot encode, such as infinities).  On error nothing is
 * stored and the session is left empty.  The session's thread only; the cache may be shared with
 * other threads. */
CB_API cb_status cb_chunk_cache_add(cb_session* session, cb_chunk_cache* cache,
                                    const char* chunk_text, const cb_rag_options* opts,
                                    int32_t* out_computed, int32_t* out_n_tokens);

/* Sets *out_found to 1 if the KV of `chunk_text` is in `cache` for `model`,
 * the chunk head and the namespace that `opts` (may be NULL: defaults) give,
 * that is if cb_rag_prefill with those options would find it; else 0.
 * Computes nothing (it tokenizes the text and the chunk head).  Only
 * chunk_head, system_prompt and cache_namespace are read.  For a cache on
 * flash this is a real lookup: it counts as a hit or a miss in
 * cb_chunk_cache_get_stats and a found entry becomes the most recently
 * used; a chunk that cb_rag_prefill computed may be reported missing until
 * its write-back finishes (cb_chunk_cache_flush).  Errors:
 * CB_ERR_INVALID_ARGUMENT (NULL model/cache/chunk_text/out_found, bad
 * options).  Thread-safe. */
CB_API cb_status cb_chunk_cache_contains(const cb_model* model, cb_chunk_cache* cache,
                                         const char* chunk_text, const cb_rag_options* opts,
                                         int32_t* out_found);

/* Removes the KV of `chunk_text` (the entry cb_chunk_cache_contains would
 * find for the same model and options, and the one computed after a context,
 * see cacheblend_experimental.h), pinned or not: for an app whose documents
 * changed or were deleted.  *out_removed (may be NULL) receives 1 if there
 * was such an entry, else 0.  On flash the write-backs queued
 * before the call finish first and the entry's file is deleted (not
 * counted in cb_chunk_cache_stats.evictions, which are for capacity).  A request
 * already using the entry keeps its copy.  Errors: CB_ERR_INVALID_ARGUMENT
 * (NULL model/cache/chunk_text, bad options), CB_ERR_IO (the store's index
 * could not be written).  Thread-safe. */
CB_API cb_status cb_chunk_cache_remove(const cb_model* model, cb_chunk_cache* cache,
                                       const char* chunk_text, const cb_rag_options* opts,
                                       int32_t* out_removed);

#ifdef __cplusplus
}
#endif

#endif /* CACHEBLEND_CACHEBLEND_H */
