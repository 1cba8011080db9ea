/* The public API used from plain C99 (compiled with -std=c99 -pedantic
 * -Werror): loads the real model, tokenizes, answers a chat question
 * greedily, and checks that misuse yields the right status and a message
 * rather than a crash.  The model path comes from $CB_MODEL or
 * CB_DEFAULT_MODEL.  Also runs two sessions of one model on two threads, and
 * retrieval-augmented prefills (cb_rag_prefill) in every mode, chunks
 * precomputed with cb_chunk_cache_add, and handles used after free, freed
 * twice or of the wrong type.  Prints "N passed, N failed"; exit status 1 on
 * failure. */
#define _POSIX_C_SOURCE 200809L
#include <cacheblend/cacheblend.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CB_DEFAULT_MODEL
#define CB_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (cond) {                                                       \
      ++g_passed;                                                     \
    } else {                                                          \
      ++g_failed;                                                     \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                 \
  } while (0)

/* An error status with a non-empty message. */
#define CHECK_ERR(expr, expected)                                                                \
  do {                                                                                           \
    cb_status s_ = (expr);                                                                       \
    if (s_ == (expected) && cb_last_error()[0] != '\0') {                                        \
      ++g_passed;                                                                                \
    } else {                                                                                     \
      ++g_failed;                                                                                \
      fprintf(stderr, "FAIL %s:%d: %s gave %d (%s), expected %d; message \"%s\"\n", __FILE__,    \
              __LINE__, #expr, (int)s_, cb_status_string(s_), (int)(expected), cb_last_error()); \
    }                                                                                            \
  } while (0)

#define CHECK_OK(expr)                                                                         \
  do {                                                                                         \
    cb_status s_ = (expr);                                                                     \
    if (s_ == CB_OK && cb_last_error()[0] == '\0') {                                           \
      ++g_passed;                                                                              \
    } else {                                                                                   \
      ++g_failed;                                                                              \
      fprintf(stderr, "FAIL %s:%d: %s gave %d (%s): %s\n", __FILE__, __LINE__, #expr, (int)s_, \
              cb_status_string(s_), cb_last_error());                                          \
    }                                                                                          \
  } while (0)

/* Collects generated text; cancels after `cancel_after` tokens if > 0. */
typedef struct {
  char text[4096];
  size_t len;
  int n_tokens;
  int cancel_after;
  int32_t first_token;
} collector;

static int collect(int32_t token, const char* piece, size_t piece_len, void* user) {
  collector* c = (collector*)user;
  if (c->n_tokens == 0) c->first_token = token;
  if (c->len + piece_len < sizeof(c->text)) {
    memcpy(c->text + c->len, piece, piece_len);
    c->len += piece_len;
    c->text[c->len] = '\0';
  }
  ++c->n_tokens;
  return c->cancel_after > 0 && c->n_tokens >= c->cancel_after;
}

static void test_version_and_status(void) {
  int s;
  CHECK(strcmp(cb_version(), CB_VERSION_STRING) == 0);
  CHECK(cb_version_number() == CB_VERSION_NUMBER);
  for (s = CB_OK; s <= CB_ERR_INTERNAL; ++s) {
    const char* text = cb_status_string((cb_status)s);
    CHECK(text != NULL && text[0] != '\0');
  }
  CHECK(strcmp(cb_status_string((cb_status)12345), "unknown status") == 0);
  CHECK(cb_last_error() != NULL);
}

static void put_u64(FILE* f, uint64_t v) {
  fwrite(&v, sizeof v, 1, f); /* GGUF is little-endian, as is every target */
}

static void put_string(FILE* f, const char* s) {
  put_u64(f, strlen(s));
  fwrite(s, 1, strlen(s), f);
}

/* Names quoted from a file reach cb_last_error as valid UTF-8 without
 * control bytes: a GGUF whose architecture is a terminal escape plus an
 * invalid byte. */
static void test_error_messages_are_escaped(void) {
  const char* path = "c_api_escape_test.gguf";
  const uint32_t version = 3, type_string = 8;
  cb_model* m = NULL;
  const char* msg;
  FILE* f = fopen(path, "wb");
  CHECK(f != NULL);
  if (f == NULL) return;
  fwrite("GGUF", 1, 4, f);
  fwrite(&version, sizeof version, 1, f);
  put_u64(f, 0); /* tensors */
  put_u64(f, 1); /* key-value pairs */
  put_string(f, "general.architecture");
  fwrite(&type_string, sizeof type_string, 1, f);
  put_string(f, "\x1b[31mred\xff\xc3\xa9");
  fclose(f);
  CHECK_ERR(cb_model_load(path, NULL, &m), CB_ERR_UNSUPPORTED);
  msg = cb_last_error();
  CHECK(strchr(msg, 0x1b) == NULL);
  CHECK(strchr(msg, (char)0xff) == NULL);
  CHECK(strstr(msg, "\\x1b[31mred\\xff\xc3\xa9") != NULL); /* valid UTF-8 (é) kept */
  remove(path);
}

/* "cpu" or "cuda": where the model's sessions run. */
static const char* backend_of(cb_model* m) {
  cb_model_info info;
  cb_model_info_init(&info);
  return cb_model_get_info(m, &info) == CB_OK ? info.backend : "?";
}

static void test_load_errors(const char* path) {
  cb_model* m = NULL;
  cb_model_options mo;

  CHECK_ERR(cb_model_load(NULL, NULL, &m), CB_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  CHECK_ERR(cb_model_load(path, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_model_load("", NULL, &m), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_model_load("/nonexistent/dir/model.gguf", NULL, &m), CB_ERR_IO);
  CHECK(m == NULL);

  cb_model_options_init(&mo);
  CHECK(mo.struct_size == sizeof(mo));
  mo.struct_size = 0;
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_INVALID_ARGUMENT);
  mo.struct_size = sizeof(mo) + 64; /* a header from the future */
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_INVALID_ARGUMENT);

  cb_model_options_init(&mo);
  mo.backend = CB_BACKEND_CUDA;
  {
    /* Only a build with CUDA on a machine with a GPU loads; everywhere else
     * (the default build, no device) the refusal names CUDA. */
    cb_status st = cb_model_load(path, &mo, &m);
    if (st == CB_OK) {
      CHECK(strcmp(backend_of(m), "cuda") == 0);
      cb_model_free(m);
      m = NULL;
    } else {
      CHECK(st == CB_ERR_UNSUPPORTED);
      CHECK(strstr(cb_last_error(), "CUDA") != NULL);
      CHECK(m == NULL);
    }
  }
  cb_model_options_init(&mo);
  CHECK(mo.device == 0);
  mo.device = -1;
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  /* A device no machine has: CUDA refuses by name, AUTO falls back to the CPU. */
  cb_model_options_init(&mo);
  mo.backend = CB_BACKEND_CUDA;
  mo.device = 4096;
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_UNSUPPORTED);
  CHECK(strstr(cb_last_error(), "CUDA") != NULL);
  CHECK(m == NULL);
  mo.backend = CB_BACKEND_AUTO;
  CHECK_OK(cb_model_load(path, &mo, &m));
  CHECK(strcmp(backend_of(m), "cpu") == 0);
  cb_model_free(m);
  m = NULL;
  /* A caller built before `device` existed: its smaller struct means device 0. */
  cb_model_options_init(&mo);
  mo.backend = CB_BACKEND_CPU;
  mo.struct_size = offsetof(cb_model_options, device);
  CHECK_OK(cb_model_load(path, &mo, &m));
  cb_model_free(m);
  m = NULL;
  cb_model_options_init(&mo);
  mo.n_threads = -1;
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  /* A thread count no device has is a mistake, named as such. */
  mo.n_threads = 1000;
  CHECK_ERR(cb_model_load(path, &mo, &m), CB_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  CHECK(strstr(cb_last_error(), "n_threads") != NULL);

  /* NULL handles elsewhere: errors or harmless defaults, never a crash. */
  cb_model_free(NULL);
  cb_session_free(NULL);
  CHECK(cb_session_n_past(NULL) == 0);
  CHECK(cb_session_n_ctx(NULL) == 0);
  CHECK(cb_token_bos(NULL) == -1);
  CHECK(cb_token_eos(NULL) == -1);
  CHECK(cb_token_is_end_of_generation(NULL, 0) == 0);
  CHECK_ERR(cb_session_prefill(NULL, NULL, 0), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_reset(NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_generate(NULL, NULL, 0, NULL, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  {
    size_t n = 0;
    cb_model_info info;
    cb_model_info_init(&info);
    CHECK_ERR(cb_tokenize(NULL, "hi", CB_NUL_TERMINATED, 1, 0, NULL, 0, &n),
              CB_ERR_INVALID_ARGUMENT);
    CHECK_ERR(cb_model_get_info(NULL, &info), CB_ERR_INVALID_ARGUMENT);
    CHECK_ERR(cb_session_create(NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  }
}

static void test_model_info(cb_model* m) {
  cb_model_info info;
  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  CHECK(info.n_layer > 0 && info.n_embd > 0 && info.n_head > 0 && info.n_head_kv > 0);
  CHECK(info.n_head % info.n_head_kv == 0);
  CHECK(info.n_vocab > 0 && info.n_ctx_train > 0 && info.file_size > 0);
  CHECK(info.name != NULL && info.name[0] != '\0');
  CHECK(info.kernels != NULL && info.kernels[0] != '\0');
  /* CB_BACKEND_AUTO: "cuda" only in a CUDA build on a machine with a GPU. */
  CHECK(info.backend != NULL &&
        (strcmp(info.backend, "cpu") == 0 || strcmp(info.backend, "cuda") == 0));
  CHECK((strcmp(info.backend, "cuda") == 0) == (strcmp(info.kernels, "cuda") == 0));
  printf(
      "model: %s (%s), %d layers, embd %d, heads %d/%d, vocab %d, ctx %d, %llu bytes, "
      "kernels %s\n",
      info.name, info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv,
      info.n_vocab, info.n_ctx_train, (unsigned long long)info.file_size, info.kernels);

  info.struct_size = 3;
  CHECK_ERR(cb_model_get_info(m, &info), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_model_get_info(m, NULL), CB_ERR_INVALID_ARGUMENT);
}

static void test_tokens(cb_model* m) {
  const char* text = "Hello, world! Caf\xc3\xa9 123";
  int32_t ids[64];
  int32_t one[1];
  size_t n = 0, n2 = 0, len = 0;
  char buf[256];
  char tiny[2];

  CHECK_OK(cb_tokenize(m, text, CB_NUL_TERMINATED, 0, 0, NULL, 0, &n));
  CHECK(n > 1 && n < 64);
  CHECK_OK(cb_tokenize(m, text, strlen(text), 0, 0, ids, 64, &n2));
  CHECK(n2 == n);
  CHECK_ERR(cb_tokenize(m, text, CB_NUL_TERMINATED, 0, 0, one, 1, &n2), CB_ERR_BUFFER_TOO_SMALL);
  CHECK(n2 == n);
  CHECK_ERR(cb_tokenize(m, NULL, 5, 0, 0, ids, 64, &n2), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_tokenize(m, text, CB_NUL_TERMINATED, 0, 0, ids, 64, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_OK(cb_tokenize(m, NULL, 0, 0, 0, NULL, 0, &n2));
  CHECK(n2 == 0);
  /* Invalid UTF-8 is accepted (byte-wise). */
  CHECK_OK(cb_tokenize(m,
                       "a\xff\xfe"
                       "b",
                       CB_NUL_TERMINATED, 0, 0, ids + 32, 32, &n2));

  /* Round trip. */
  CHECK_OK(cb_detokenize(m, ids, n, 0, NULL, 0, &len));
  CHECK(len == strlen(text));
  CHECK_OK(cb_detokenize(m, ids, n, 0, buf, sizeof buf, &len));
  CHECK(strcmp(buf, text) == 0);
  CHECK_ERR(cb_detokenize(m, ids, n, 0, tiny, sizeof tiny, &len), CB_ERR_BUFFER_TOO_SMALL);
  CHECK(len == strlen(text));
  one[0] = -5;
  CHECK_ERR(cb_detokenize(m, one, 1, 0, buf, sizeof buf, &len), CB_ERR_INVALID_ARGUMENT);
  one[0] = 1 << 30;
  CHECK_ERR(cb_detokenize(m, one, 1, 0, buf, sizeof buf, &len), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_token_to_piece(m, 1 << 30, 0, buf, sizeof buf, &len), CB_ERR_INVALID_ARGUMENT);
  CHECK_OK(cb_token_to_piece(m, ids[0], 0, buf, sizeof buf, &len));
  CHECK(len > 0 && strncmp(buf, text, len) == 0);
  CHECK(cb_token_eos(m) >= 0);
}

/* Formats and tokenizes a ChatML question; returns the token count. */
static size_t chat_prompt(cb_model* m, const char* question, int32_t* ids, size_t cap) {
  cb_chat_message msg;
  char buf[1024];
  size_t len = 0, n = 0;
  msg.role = "user";
  msg.content = question;
  CHECK_OK(cb_chat_format(m, &msg, 1, 1, NULL, 0, &len));
  CHECK(len < sizeof buf);
  CHECK_OK(cb_chat_format(m, &msg, 1, 1, buf, sizeof buf, &len));
  CHECK(strstr(buf, "<|im_start|>user\n") != NULL);
  CHECK(strstr(buf, "<|im_start|>assistant\n") != NULL);
  CHECK_OK(cb_tokenize(m, buf, len, 1, 1, ids, cap, &n));
  return n;
}

static void test_chat_format_errors(cb_model* m) {
  cb_chat_message msg;
  char buf[8];
  size_t len = 0;
  msg.role = NULL;
  msg.content = "x";
  CHECK_ERR(cb_chat_format(m, &msg, 1, 1, NULL, 0, &len), CB_ERR_INVALID_ARGUMENT);
  msg.role = "user";
  msg.content = NULL;
  CHECK_ERR(cb_chat_format(m, &msg, 1, 1, NULL, 0, &len), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chat_format(m, NULL, 1, 1, NULL, 0, &len), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chat_format(NULL, &msg, 1, 1, NULL, 0, &len), CB_ERR_INVALID_ARGUMENT);
  msg.content = "a long enough message";
  CHECK_ERR(cb_chat_format(m, &msg, 1, 1, buf, sizeof buf, &len), CB_ERR_BUFFER_TOO_SMALL);
  CHECK(len > sizeof buf);
}

static void test_generate(cb_model* m) {
  int32_t ids[256];
  size_t n;
  cb_session* s = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_generate_stats st;
  collector c;
  int32_t n_past_after;

  n = chat_prompt(m, "What is the capital of France?", ids, 256);
  CHECK(n > 5);

  cb_session_options_init(&so);
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s));
  CHECK(s != NULL);
  if (s == NULL) return;
  CHECK(cb_session_n_past(s) == 0);
  CHECK(cb_session_n_ctx(s) > 0);

  cb_generate_options_init(&go);
  go.max_tokens = 16;
  cb_generate_stats_init(&st);
  memset(&c, 0, sizeof c);
  CHECK_OK(cb_generate(s, ids, n, &go, collect, &c, &st));
  printf("answer: %s\n", c.text);
  printf(
      "stats: n_prompt %d, n_generated %d, ttft %.1f ms, prefill %.1f ms, decode %.1f ms, "
      "%.1f tok/s, stop %d\n",
      st.n_prompt, st.n_generated, st.ttft_ms, st.prefill_ms, st.decode_ms, st.tok_s,
      (int)st.stop_reason);
  CHECK(strstr(c.text, "Paris") != NULL);
  CHECK(st.n_prompt == (int32_t)n);
  CHECK(st.n_generated == c.n_tokens && st.n_generated > 0 && st.n_generated <= 16);
  CHECK(st.ttft_ms > 0.0 && st.prefill_ms > 0.0 && st.ttft_ms >= st.prefill_ms);
  CHECK(st.stop_reason == CB_STOP_MAX_TOKENS || st.stop_reason == CB_STOP_END_OF_GENERATION);
  n_past_after = cb_session_n_past(s);
  CHECK(n_past_after == (int32_t)n + st.n_generated);

  /* Deterministic: the same greedy run again gives the same text. */
  {
    collector c2;
    memset(&c2, 0, sizeof c2);
    CHECK_OK(cb_session_reset(s));
    CHECK(cb_session_n_past(s) == 0);
    CHECK_OK(cb_generate(s, ids, n, &go, collect, &c2, NULL));
    CHECK(strcmp(c.text, c2.text) == 0);
  }

  /* Cancel from the callback after 3 tokens. */
  CHECK_OK(cb_session_reset(s));
  memset(&c, 0, sizeof c);
  c.cancel_after = 3;
  cb_generate_stats_init(&st);
  CHECK_ERR(cb_generate(s, ids, n, &go, collect, &c, &st), CB_ERR_CANCELLED);
  CHECK(c.n_tokens == 3 && st.n_generated == 3 && st.stop_reason == CB_STOP_CANCELLED);
  CHECK(cb_session_n_past(s) == (int32_t)n + 3);
  /* ... and continue from there with an empty prompt. */
  memset(&c, 0, sizeof c);
  go.max_tokens = 2;
  CHECK_OK(cb_generate(s, NULL, 0, &go, collect, &c, NULL));
  CHECK(c.n_tokens >= 1 && c.n_tokens <= 2);

  /* Sampling with a seed is reproducible. */
  {
    cb_sampling_options samp;
    collector a, b;
    cb_sampling_options_init(&samp);
    samp.temperature = 0.8f;
    samp.top_k = 40;
    samp.top_p = 0.95f;
    samp.seed = 42;
    go.max_tokens = 8;
    go.sampling = &samp;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    CHECK_OK(cb_session_reset(s));
    CHECK_OK(cb_generate(s, ids, n, &go, collect, &a, NULL));
    CHECK_OK(cb_session_reset(s));
    CHECK_OK(cb_generate(s, ids, n, &go, collect, &b, NULL));
    CHECK(strcmp(a.text, b.text) == 0);
    samp.top_p = 1.5f;
    CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
    samp.top_p = 0.9f;
    samp.struct_size = 1;
    CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
    go.sampling = NULL;
  }

  /* Misuse on a live session. */
  CHECK_OK(cb_session_reset(s));
  CHECK_ERR(cb_generate(s, NULL, 0, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_generate(s, NULL, 4, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_prefill(s, ids, 0), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_prefill(s, NULL, 3), CB_ERR_INVALID_ARGUMENT);
  go.struct_size = 0;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  cb_generate_options_init(&go);
  go.max_tokens = -1;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  cb_generate_options_init(&go);
  cb_generate_stats_init(&st);
  st.struct_size = 2;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, &st), CB_ERR_INVALID_ARGUMENT);
  {
    int32_t bad[2];
    bad[0] = ids[0];
    bad[1] = 1 << 30;
    CHECK_ERR(cb_session_prefill(s, bad, 2), CB_ERR_INVALID_ARGUMENT);
    CHECK(cb_session_n_past(s) == 0);
  }
  /* Prefill then generate with an empty prompt continues from it. */
  CHECK_OK(cb_session_prefill(s, ids, n));
  CHECK(cb_session_n_past(s) == (int32_t)n);
  memset(&c, 0, sizeof c);
  go.max_tokens = 16;
  CHECK_OK(cb_generate(s, NULL, 0, &go, collect, &c, NULL));
  CHECK(strstr(c.text, "Paris") != NULL);

  cb_session_free(s);
}

/* Stop strings, the repetition penalty and min-p: the text ends before the
 * first stop string (also one that spans tokens), the callback never sees
 * it, and bad values are refused. */
static void test_generation_controls(cb_model* m) {
  cb_session* s = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_generate_stats st;
  cb_sampling_options samp;
  collector plain, cut, loop_plain, loop_damped;
  int32_t ids[256];
  size_t n = chat_prompt(m, "What is the capital of France? Answer in a long sentence.", ids, 256);
  char stop[8];
  const char* stops[2];
  const char* where = NULL;
  const char* empty = "";
  cb_session_options_init(&so);
  so.n_ctx = 512;
  CHECK_OK(cb_session_create(m, &so, &s));
  if (s == NULL) return;
  cb_generate_options_init(&go);
  go.max_tokens = 16;
  memset(&plain, 0, sizeof plain);
  CHECK_OK(cb_generate(s, ids, n, &go, collect, &plain, NULL));
  CHECK(plain.len > 12);
  if (plain.len <= 12) goto done;
  /* Six bytes from the middle of the answer, which cross a token boundary
   * unless a token is that long. */
  memcpy(stop, plain.text + 6, 6);
  stop[6] = '\0';
  where = strstr(plain.text, stop);
  stops[0] = "never-seen-text";
  stops[1] = stop;
  go.stop_strings = stops;
  go.n_stop_strings = 2;
  CHECK_OK(cb_session_reset(s));
  memset(&cut, 0, sizeof cut);
  cb_generate_stats_init(&st);
  CHECK_OK(cb_generate(s, ids, n, &go, collect, &cut, &st));
  CHECK(st.stop_reason == CB_STOP_STRING);
  CHECK(where != NULL && cut.len == (size_t)(where - plain.text));
  CHECK(strncmp(cut.text, plain.text, cut.len) == 0);
  CHECK(st.n_generated == cut.n_tokens);
  /* A stop string that never comes changes nothing. */
  go.n_stop_strings = 1;
  CHECK_OK(cb_session_reset(s));
  memset(&cut, 0, sizeof cut);
  cb_generate_stats_init(&st);
  CHECK_OK(cb_generate(s, ids, n, &go, collect, &cut, &st));
  CHECK(strcmp(cut.text, plain.text) == 0 && st.stop_reason != CB_STOP_STRING);
  /* Refused: NULL array, NULL entry, empty string. */
  go.stop_strings = NULL;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  stops[0] = NULL;
  go.stop_strings = stops;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  go.stop_strings = &empty;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  /* A caller built before the stop strings existed: its shorter struct. */
  cb_generate_options_init(&go);
  go.max_tokens = 16;
  go.struct_size = offsetof(cb_generate_options, stop_strings);
  CHECK_OK(cb_session_reset(s));
  memset(&cut, 0, sizeof cut);
  CHECK_OK(cb_generate(s, ids, n, &go, collect, &cut, NULL));
  CHECK(strcmp(cut.text, plain.text) == 0);

  /* The repetition penalty breaks a loop the greedy answer falls into. */
  {
    const char* text = "Repeat after me: 15 seconds, 15 seconds, 15 seconds, 15 seconds,";
    size_t k = 0;
    CHECK_OK(cb_tokenize(m, text, strlen(text), 1, 0, ids, 256, &k));
    cb_generate_options_init(&go);
    go.max_tokens = 16;
    cb_sampling_options_init(&samp);
    CHECK(samp.min_p == 0.0f && samp.repeat_penalty == 1.0f && samp.repeat_last_n == 64);
    go.sampling = &samp;
    memset(&loop_plain, 0, sizeof loop_plain);
    memset(&loop_damped, 0, sizeof loop_damped);
    CHECK_OK(cb_session_reset(s));
    CHECK_OK(cb_generate(s, ids, k, &go, collect, &loop_plain, NULL));
    samp.repeat_penalty = 1.5f;
    CHECK_OK(cb_session_reset(s));
    CHECK_OK(cb_generate(s, ids, k, &go, collect, &loop_damped, NULL));
    printf("loop: \"%s\"; with repeat_penalty 1.5: \"%s\"\n", loop_plain.text, loop_damped.text);
    CHECK(strcmp(loop_plain.text, loop_damped.text) != 0);
    /* Older struct: the new fields take their defaults. */
    samp.struct_size = offsetof(cb_sampling_options, min_p);
    CHECK_OK(cb_session_reset(s));
    memset(&cut, 0, sizeof cut);
    CHECK_OK(cb_generate(s, ids, k, &go, collect, &cut, NULL));
    CHECK(strcmp(cut.text, loop_plain.text) == 0);
    cb_sampling_options_init(&samp);
    samp.repeat_penalty = 0.0f;
    CHECK_ERR(cb_generate(s, ids, k, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
    cb_sampling_options_init(&samp);
    samp.min_p = 1.0f;
    CHECK_ERR(cb_generate(s, ids, k, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
    cb_sampling_options_init(&samp);
    samp.repeat_last_n = -1;
    CHECK_ERR(cb_generate(s, ids, k, &go, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  }
done:
  cb_session_free(s);
}

static void test_context_limits(cb_model* m) {
  cb_session* s = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_generate_stats st;
  int32_t ids[256];
  size_t n;
  cb_model_info info;

  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));

  cb_session_options_init(&so);
  so.n_ctx = info.n_ctx_train + 1;
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);
  so.n_ctx = 1 << 30;
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);
  so.n_ctx = -1;
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);
  CHECK(s == NULL);
  cb_session_options_init(&so);
  so.n_threads = 1000;
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);
  CHECK(s == NULL);
  cb_session_options_init(&so);
  so.struct_size = sizeof(so) - 1;
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);

  /* A prompt longer than the context. */
  n = chat_prompt(m, "What is the capital of France? Please answer in one word.", ids, 256);
  cb_session_options_init(&so);
  so.n_ctx = 8;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s));
  if (s == NULL) return;
  CHECK(cb_session_n_ctx(s) == 8);
  CHECK(n > 8);
  cb_generate_options_init(&go);
  go.max_tokens = 4;
  CHECK_ERR(cb_generate(s, ids, n, &go, NULL, NULL, NULL), CB_ERR_CONTEXT_OVERFLOW);
  CHECK(cb_session_n_past(s) == 0);
  CHECK_ERR(cb_session_prefill(s, ids, n), CB_ERR_CONTEXT_OVERFLOW);
  CHECK(cb_session_n_past(s) == 0);

  /* Generation stops cleanly when the context fills up. */
  cb_generate_options_init(&go);
  go.max_tokens = 100;
  go.stop_at_end_of_generation = 0;
  cb_generate_stats_init(&st);
  CHECK_OK(cb_generate(s, ids, 5, &go, NULL, NULL, &st));
  CHECK(st.stop_reason == CB_STOP_CONTEXT_FULL);
  CHECK(st.n_generated == 3);
  CHECK(cb_session_n_past(s) == 8);
  CHECK_ERR(cb_session_prefill(s, ids, 1), CB_ERR_CONTEXT_OVERFLOW);
  cb_session_free(s);
}

/* The session keeps the model alive after cb_model_free. */
static void test_lifetime(const char* path) {
  cb_model* m = NULL;
  cb_session* s = NULL;
  int32_t ids[64];
  size_t n = 0;
  cb_session_options so;
  cb_generate_options go;
  CHECK_OK(cb_model_load(path, NULL, &m));
  if (m == NULL) return;
  CHECK_OK(cb_tokenize(m, "Once upon a time", CB_NUL_TERMINATED, 1, 0, ids, 64, &n));
  cb_session_options_init(&so);
  so.n_ctx = 64;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s));
  cb_model_free(m);
  if (s == NULL) return;
  cb_generate_options_init(&go);
  go.max_tokens = 4;
  CHECK_OK(cb_generate(s, ids, n, &go, NULL, NULL, NULL));
  cb_session_free(s);
}

/* One model, two sessions, two threads: both get the greedy answer. */
typedef struct {
  cb_model* model;
  const int32_t* ids;
  size_t n;
  collector out;
  cb_status status;
} worker;

static void* run_worker(void* arg) {
  worker* w = (worker*)arg;
  cb_session* s = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_session_options_init(&so);
  so.n_ctx = 128;
  so.n_threads = 1;
  w->status = cb_session_create(w->model, &so, &s);
  if (w->status != CB_OK) return NULL;
  cb_generate_options_init(&go);
  go.max_tokens = 8;
  w->status = cb_generate(s, w->ids, w->n, &go, collect, &w->out, NULL);
  cb_session_free(s);
  return NULL;
}

static void test_threads(cb_model* m) {
  int32_t ids[256];
  worker w[2];
  pthread_t th[2];
  int i, started[2];
  size_t n = chat_prompt(m, "What is the capital of France?", ids, 256);
  for (i = 0; i < 2; ++i) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].model = m;
    w[i].ids = ids;
    w[i].n = n;
    w[i].status = CB_ERR_INTERNAL;
    started[i] = pthread_create(&th[i], NULL, run_worker, &w[i]) == 0;
    CHECK(started[i]);
  }
  for (i = 0; i < 2; ++i)
    if (started[i]) pthread_join(th[i], NULL);
  CHECK(w[0].status == CB_OK && w[1].status == CB_OK);
  CHECK(strstr(w[0].out.text, "Paris") != NULL);
  CHECK(strcmp(w[0].out.text, w[1].out.text) == 0);
}

/* Two threads on one session: while one generates (held inside its token
 * callback), the other's calls are refused with a message that says so. */
typedef struct {
  cb_session* s;
  const int32_t* ids;
  size_t n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int holding, probed;
  cb_status status;
} session_holder;

static int hold_session(int32_t token, const char* piece, size_t piece_len, void* user) {
  session_holder* h = (session_holder*)user;
  (void)token;
  (void)piece;
  (void)piece_len;
  pthread_mutex_lock(&h->mu);
  h->holding = 1;
  pthread_cond_broadcast(&h->cv);
  while (!h->probed) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  return 1; /* stop after this token */
}

static void* generate_holding(void* arg) {
  session_holder* h = (session_holder*)arg;
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 4;
  h->status = cb_generate(h->s, h->ids, h->n, &go, hold_session, h, NULL);
  return NULL;
}

static void test_concurrent_use_of_one_session(cb_model* m) {
  int32_t ids[256];
  session_holder h;
  pthread_t th;
  cb_session_options so;
  const float* logits = NULL;
  size_t n_vocab = 0;
  memset(&h, 0, sizeof h);
  h.n = chat_prompt(m, "What is the capital of France?", ids, 256);
  h.ids = ids;
  cb_session_options_init(&so);
  so.n_ctx = 128;
  so.n_threads = 1;
  CHECK_OK(cb_session_create(m, &so, &h.s));
  if (h.s == NULL) return;
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  if (pthread_create(&th, NULL, generate_holding, &h) == 0) {
    pthread_mutex_lock(&h.mu);
    while (!h.holding) pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    CHECK_ERR(cb_session_prefill(h.s, ids, h.n), CB_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), "another thread") != NULL);
    CHECK_ERR(cb_session_reset(h.s), CB_ERR_INVALID_ARGUMENT);
    CHECK_ERR(cb_session_logits(h.s, &logits, &n_vocab), CB_ERR_INVALID_ARGUMENT);
    CHECK_ERR(cb_generate(h.s, ids, h.n, NULL, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
    pthread_mutex_lock(&h.mu);
    h.probed = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(th, NULL);
    CHECK(h.status == CB_ERR_CANCELLED);
    /* Free again once the call is over. */
    CHECK_OK(cb_session_reset(h.s));
  } else {
    CHECK(0);
  }
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.mu);
  cb_session_free(h.s);
}

/* ------------------------------------------------------------------------ */
/* Retrieval-augmented prefill                                                */

/* The answer is in the second chunk, whose cached KV (computed without the
 * first chunk before it) is what blending has to correct. */
static const char* const kRagChunks[2] = {
    "The museum opens at nine in the morning and closes at five in the evening.",
    "The secret code of the vault is 4721. Only the bank manager knows it."};
static const char* const kRagQuestion = "What is the secret code of the vault?";

/* The abort callback: counts its calls and asks to stop from call `stop_at`
 * on (0: never), or whenever `flag` is set. */
typedef struct {
  int calls;
  int stop_at;
  int flag;
  int tokens; /* seen by flag_after_two */
} abort_state;

static int count_and_abort(void* user) {
  abort_state* a = (abort_state*)user;
  ++a->calls;
  return a->flag || (a->stop_at > 0 && a->calls >= a->stop_at);
}

/* Sets the abort flag after two tokens, as another thread would. */
static int flag_after_two(int32_t token, const char* piece, size_t piece_len, void* user) {
  abort_state* a = (abort_state*)user;
  (void)token;
  (void)piece;
  (void)piece_len;
  if (++a->tokens >= 2) a->flag = 1;
  return 0;
}

/* Cancellation: a prefill stops between the steps of a layer and leaves the
 * session as it was; a RAG prefill leaves it empty; generation stops between
 * tokens.  After each, the same work without the callback gives the same
 * result as a session that was never cancelled. */
static void test_abort_callback(cb_model* m) {
  cb_session_options so;
  cb_session* s = NULL;
  cb_model_info info;
  abort_state ab;
  int32_t ids[400];
  size_t n = 0, nv = 0, nv2 = 0;
  const float* l = NULL;
  float* first = NULL;
  float* whole = NULL;
  int calls_per_prefill = 0;
  char text[4096] = "";
  int i;
  for (i = 0; i < 16; ++i)
    strcat(text, "The lighthouse keeper counted the ships that passed in the night. ");
  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  CHECK_OK(cb_tokenize(m, text, strlen(text), 1, 0, ids, 400, &n));
  CHECK(n > 150);
  cb_session_options_init(&so);
  so.n_ctx = 512;
  so.n_batch = 64; /* several batches per prefill */
  CHECK_OK(cb_session_create(m, &so, &s));
  if (s == NULL) return;
  CHECK_ERR(cb_session_set_abort_callback(NULL, count_and_abort, &ab), CB_ERR_INVALID_ARGUMENT);

  /* Uncancelled: the first 10 tokens, then the rest; the callback is asked
   * several times per layer of every batch. */
  CHECK_OK(cb_session_prefill(s, ids, 10));
  CHECK_OK(cb_session_logits(s, &l, &nv));
  first = (float*)malloc(nv * sizeof(float));
  whole = (float*)malloc(nv * sizeof(float));
  if (first == NULL || whole == NULL) goto done;
  memcpy(first, l, nv * sizeof(float));
  memset(&ab, 0, sizeof ab);
  CHECK_OK(cb_session_set_abort_callback(s, count_and_abort, &ab));
  CHECK_OK(cb_session_prefill(s, ids + 10, n - 10));
  calls_per_prefill = ab.calls;
  CHECK(calls_per_prefill >= 4 * info.n_layer * (int)((n - 10 + 63) / 64));
  CHECK_OK(cb_session_logits(s, &l, &nv));
  memcpy(whole, l, nv * sizeof(float));

  /* Cancelled half-way through the second batch: n_past and the logits are
   * those before the call. */
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_session_prefill(s, ids, 10));
  memset(&ab, 0, sizeof ab);
  ab.stop_at = calls_per_prefill / 2;
  CHECK_ERR(cb_session_prefill(s, ids + 10, n - 10), CB_ERR_CANCELLED);
  CHECK(ab.calls == ab.stop_at);
  CHECK(cb_session_n_past(s) == 10);
  CHECK_OK(cb_session_logits(s, &l, &nv2));
  CHECK(nv2 == nv && memcmp(l, first, nv * sizeof(float)) == 0);
  /* The same prefill without the callback: as if never cancelled. */
  CHECK_OK(cb_session_set_abort_callback(s, NULL, NULL));
  CHECK_OK(cb_session_prefill(s, ids + 10, n - 10));
  CHECK(cb_session_n_past(s) == (int32_t)n);
  CHECK_OK(cb_session_logits(s, &l, &nv2));
  CHECK(memcmp(l, whole, nv * sizeof(float)) == 0);

  /* cb_generate: a prompt cancelled at once leaves the session as it was;
   * a flag set after two tokens stops the decoding there. */
  {
    cb_generate_options go;
    cb_generate_stats gs;
    cb_generate_options_init(&go);
    go.max_tokens = 8;
    CHECK_OK(cb_session_reset(s));
    memset(&ab, 0, sizeof ab);
    ab.flag = 1;
    CHECK_OK(cb_session_set_abort_callback(s, count_and_abort, &ab));
    CHECK_ERR(cb_generate(s, ids, 40, &go, NULL, NULL, NULL), CB_ERR_CANCELLED);
    CHECK(cb_session_n_past(s) == 0 && ab.calls == 1);
    memset(&ab, 0, sizeof ab);
    cb_generate_stats_init(&gs);
    CHECK_ERR(cb_generate(s, ids, 40, &go, flag_after_two, &ab, &gs), CB_ERR_CANCELLED);
    CHECK(strstr(cb_last_error(), "abort callback") != NULL);
    CHECK(gs.n_generated == 2 && gs.stop_reason == CB_STOP_CANCELLED);
    CHECK(cb_session_n_past(s) == 42); /* the prompt and both tokens (the second pending) */
  }

  /* cb_rag_prefill cancelled part-way leaves the session empty; without the
   * callback the request then runs. */
  {
    cb_rag_options ro;
    cb_rag_stats st;
    cb_rag_options_init(&ro);
    ro.mode = CB_MODE_FULL;
    CHECK_OK(cb_session_reset(s));
    memset(&ab, 0, sizeof ab);
    ab.stop_at = 3 * info.n_layer;
    CHECK_OK(cb_session_set_abort_callback(s, count_and_abort, &ab));
    cb_rag_stats_init(&st);
    CHECK_ERR(cb_rag_prefill(s, NULL, kRagChunks, 2, kRagQuestion, &ro, &st), CB_ERR_CANCELLED);
    CHECK(cb_session_n_past(s) == 0);
    CHECK_OK(cb_session_set_abort_callback(s, NULL, NULL));
    CHECK_OK(cb_rag_prefill(s, NULL, kRagChunks, 2, kRagQuestion, &ro, &st));
    CHECK(cb_session_n_past(s) == st.n_tokens);
  }
done:
  free(first);
  free(whole);
  cb_session_free(s);
}

/* One RAG request on the reset session `s`, then greedy generation of up
 * to 12 tokens into `out`; the first-token logits are copied to `logits`
 * (n_vocab floats) when not NULL. */
static cb_status rag_answer(cb_session* s, cb_chunk_cache* cache, const cb_rag_options* ro,
                            cb_rag_stats* st, collector* out, float* logits, int32_t n_vocab) {
  cb_generate_options go;
  cb_generate_stats gs;
  cb_status status;
  memset(out, 0, sizeof *out);
  if (cb_session_reset(s) != CB_OK) return CB_ERR_INTERNAL;
  status = cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, ro, st);
  if (status != CB_OK) return status;
  if (logits != NULL) {
    const float* l = NULL;
    size_t n = 0;
    status = cb_session_logits(s, &l, &n);
    if (status != CB_OK) return status;
    if (n != (size_t)n_vocab) return CB_ERR_INTERNAL;
    memcpy(logits, l, n * sizeof(float));
  }
  cb_generate_options_init(&go);
  go.max_tokens = 12;
  cb_generate_stats_init(&gs);
  status = cb_generate(s, NULL, 0, &go, collect, out, &gs);
  /* The request's time to first token includes the RAG prefill. */
  if (st != NULL) CHECK(gs.prefill_ms >= st->total_ms && gs.ttft_ms >= gs.prefill_ms);
  return status;
}

static int32_t argmax(const float* v, int32_t n) {
  int32_t i, best = 0;
  for (i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float* a, const float* b, int32_t n) {
  double num = 0.0, den = 0.0;
  int32_t i;
  for (i = 0; i < n; ++i) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0.0 ? sqrt(num / den) : 1.0;
}

/* The chunk cache on flash: a miss is computed and written back, the next
 * request reads it from the store and answers the same; bad options are
 * refused. */
static void test_rag_store(cb_model* m) {
  char dir[] = "/tmp/cb_c_api_store.XXXXXX";
  cb_chunk_cache* cache = NULL;
  cb_store_options so;
  cb_session_options sess_o;
  cb_session* s = NULL;
  cb_rag_options ro;
  cb_rag_stats st;
  cb_chunk_cache_stats cs;
  collector c1, c2;
  char cmd[128];

  CHECK(mkdtemp(dir) != NULL);
  cb_store_options_init(&so);
  CHECK(so.struct_size == sizeof so && so.codec == CB_CODEC_Q8 && so.capacity_bytes > 0);
  CHECK_ERR(cb_chunk_cache_open(NULL, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_open(dir, &so, NULL), CB_ERR_INVALID_ARGUMENT);
  so.codec = (cb_codec)9;
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  so.codec = CB_CODEC_Q8;
  so.struct_size = 3;
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_open("/proc/no_such_dir/store", NULL, &cache), CB_ERR_IO);
  CHECK(strlen(cb_last_error()) > 0);
  cb_store_options_init(&so);
  CHECK_OK(cb_chunk_cache_open(dir, &so, &cache));
  CHECK_ERR(cb_chunk_cache_flush(NULL), CB_ERR_INVALID_ARGUMENT);

  cb_session_options_init(&sess_o);
  sess_o.n_threads = 2;
  sess_o.n_ctx = 512;
  CHECK_OK(cb_session_create(m, &sess_o, &s));
  cb_rag_options_init(&ro);
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c1, NULL, 0));
  CHECK(st.cache_misses == 2 && st.cache_hits == 0);
  CHECK_OK(cb_chunk_cache_flush(cache));
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c2, NULL, 0));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  CHECK(strstr(c2.text, "4721") != NULL);
  CHECK(st.pipelined == 1 && st.bytes_read > 0);
  /* Only a discrete GPU copies loaded KV (upload_ms, timed by the GPU). */
  CHECK(st.upload_ms >= 0.0);
  if (strcmp(backend_of(m), "cpu") == 0) CHECK(st.upload_ms == 0.0);
  /* The same request without the loader thread gives the same answer; a
   * stats struct from before upload_ms existed is still filled. */
  ro.pipeline = 0;
  cb_rag_stats_init(&st);
  st.struct_size = offsetof(cb_rag_stats, upload_ms);
  st.upload_ms = -7.0;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c1, NULL, 0));
  CHECK(st.pipelined == 0 && strcmp(c1.text, c2.text) == 0);
  CHECK(st.bytes_read > 0 && st.upload_ms == -7.0);
  /* Auto ratio: the controller's choice is at least r_min = 0.15. */
  ro.pipeline = 1;
  ro.auto_ratio = 1;
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c1, NULL, 0));
  CHECK(st.ratio >= 0.15f && st.ratio <= 1.0f);
  ro.mode = CB_MODE_REUSE;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  ro.mode = CB_MODE_BLEND;
  ro.auto_ratio = 0;
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 2 && cs.hits >= 2 && cs.bytes_read > 0 && cs.corrupt_drops == 0);

  /* The caller's read speed overrides the measured one: at an assumed
   * 1 byte/s, reading could never hide behind recompute, so the controller
   * recomputes everything and reads nothing.  A struct from before the
   * field existed is still accepted. */
  cb_chunk_cache_free(cache);
  cache = NULL;
  cb_store_options_init(&so);
  so.struct_size = offsetof(cb_store_options, assumed_read_bytes_per_sec);
  CHECK_OK(cb_chunk_cache_open(dir, &so, &cache));
  cb_chunk_cache_free(cache);
  cache = NULL;
  cb_store_options_init(&so);
  so.assumed_read_bytes_per_sec = -1.0;
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  so.assumed_read_bytes_per_sec = 1.0;
  CHECK_OK(cb_chunk_cache_open(dir, &so, &cache));
  ro.auto_ratio = 1;
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c1, NULL, 0));
  CHECK(st.ratio == 1.0f && st.bytes_read == 0 && st.cache_hits == 2);
  CHECK(strstr(c1.text, "4721") != NULL);
  ro.auto_ratio = 0;
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 2 && cs.hits >= 2 && cs.bytes_read == 0); /* found, not read */
  CHECK_OK(cb_chunk_cache_clear(cache));
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 0);

  cb_session_free(s);
  cb_chunk_cache_free(cache);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* Precomputing chunks from text (an ingest step): what cb_chunk_cache_add
 * stores is what cb_rag_prefill finds with the same options, in RAM and on
 * flash; other options (namespace, system prompt, chunk head) do not see it. */
static void test_chunk_cache_add(cb_model* m) {
  char dir[] = "/tmp/cb_c_api_add.XXXXXX";
  char cmd[128];
  char text[64], with_blank[160];
  int made_dir = 0;
  cb_chunk_cache* cache = NULL;
  cb_session* s = NULL;
  cb_session* small = NULL;
  cb_session_options so;
  cb_rag_options ro, other;
  cb_rag_stats st;
  cb_chunk_cache_stats cs;
  collector c;
  int32_t computed = -1, n_tok = -1, found = -1, ids[64];
  size_t n = 0, i;
  char* long_chunk;

  cb_session_options_init(&so);
  so.n_ctx = 512;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s));
  CHECK_OK(cb_chunk_cache_create(&cache));
  if (s == NULL || cache == NULL) goto done;
  cb_rag_options_init(&ro);

  /* RAM: absent, added (computed once), then found. */
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &ro, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[0], &ro, &computed, &n_tok));
  CHECK(computed == 1);
  CHECK(cb_session_n_past(s) == 0);
  /* The chunk's tokens are its text plus a blank line, tokenized as data. */
  snprintf(with_blank, sizeof with_blank, "%s\n\n", kRagChunks[0]);
  CHECK_OK(cb_tokenize(m, with_blank, CB_NUL_TERMINATED, 0, 0, ids, 64, &n));
  CHECK(n > 0 && n_tok == (int32_t)n);
  snprintf(text, sizeof text, "%.40s", kRagChunks[0]);
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], NULL, &found));
  CHECK(found == 1);
  computed = -1;
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[0], NULL, &computed, NULL));
  CHECK(computed == 0);
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[1], &ro, NULL, NULL));
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 2);
  /* A prefix of a chunk is another chunk. */
  CHECK_OK(cb_chunk_cache_contains(m, cache, text, &ro, &found));
  CHECK(found == 0);

  /* Each part of the key separates entries. */
  other = ro;
  other.cache_namespace = "tenant-b";
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &other, &found));
  CHECK(found == 0);
  other = ro;
  other.system_prompt = "You are a terse assistant.";
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &other, &found));
  CHECK(found == 0);
  other = ro;
  other.chunk_head = CB_CHUNK_HEAD_NONE;
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &other, &found));
  CHECK(found == 0);
  /* The default namespace is both NULL and "". */
  other = ro;
  other.cache_namespace = "";
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &other, &found));
  CHECK(found == 1);

  /* The request finds both chunks and answers from them. */
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  CHECK(strstr(c.text, "4721") != NULL);

  /* With another chunk head and namespace: added there, found there. */
  other = ro;
  other.chunk_head = CB_CHUNK_HEAD_NONE;
  other.cache_namespace = "tenant-b";
  CHECK_OK(cb_session_reset(s));
  for (i = 0; i < 2; ++i) {
    computed = -1;
    CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[i], &other, &computed, NULL));
    CHECK(computed == 1);
  }
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &other, &st, &c, NULL, 0));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  /* Removed from that namespace only: a miss there, still a hit in the
   * default one; a second removal finds nothing. */
  found = -1;
  CHECK_OK(cb_chunk_cache_remove(m, cache, kRagChunks[1], &other, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_remove(m, cache, kRagChunks[1], &other, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[1], &other, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[1], &ro, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_remove(m, cache, "never added", NULL, NULL));
  CHECK_ERR(cb_chunk_cache_remove(m, cache, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_remove(NULL, cache, kRagChunks[1], NULL, NULL), CB_ERR_INVALID_ARGUMENT);

  /* Misuse. */
  CHECK_OK(cb_session_reset(s));
  CHECK_ERR(cb_chunk_cache_add(NULL, cache, kRagChunks[0], NULL, NULL, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_add(s, NULL, kRagChunks[0], NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_add(s, cache, NULL, NULL, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains(NULL, cache, kRagChunks[0], NULL, &found),
            CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains(m, NULL, kRagChunks[0], NULL, &found), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains(m, cache, NULL, NULL, &found), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains(m, cache, kRagChunks[0], NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  other = ro;
  other.struct_size = 5;
  CHECK_ERR(cb_chunk_cache_add(s, cache, "new chunk", &other, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains(m, cache, kRagChunks[0], &other, &found),
            CB_ERR_INVALID_ARGUMENT);
  other = ro;
  other.chunk_head = (cb_chunk_head)7;
  CHECK_ERR(cb_chunk_cache_add(s, cache, "new chunk", &other, NULL, NULL), CB_ERR_INVALID_ARGUMENT);
  /* A session that is not empty; outputs untouched on error. */
  CHECK_OK(cb_tokenize(m, "Hello", CB_NUL_TERMINATED, 0, 0, ids, 64, &n));
  CHECK_OK(cb_session_prefill(s, ids, n));
  computed = -7;
  CHECK_ERR(cb_chunk_cache_add(s, cache, "new chunk", NULL, &computed, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(computed == -7);
  CHECK_OK(cb_session_reset(s));
  /* A chunk (plus its head) longer than the context: nothing stored, the
   * session stays empty and usable. */
  cb_session_options_init(&so);
  so.n_ctx = 48;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &small));
  long_chunk = (char*)malloc(2000);
  if (small != NULL && long_chunk != NULL) {
    long_chunk[0] = '\0';
    for (i = 0; i < 40; ++i) strcat(long_chunk, "The vault is closed. ");
    CHECK_ERR(cb_chunk_cache_add(small, cache, long_chunk, NULL, NULL, NULL),
              CB_ERR_CONTEXT_OVERFLOW);
    CHECK(cb_session_n_past(small) == 0);
    CHECK_OK(cb_chunk_cache_contains(m, cache, long_chunk, NULL, &found));
    CHECK(found == 0);
    /* A short chunk without a chunk head fits. */
    other = ro;
    other.chunk_head = CB_CHUNK_HEAD_NONE;
    CHECK_OK(cb_chunk_cache_add(small, cache, "A short chunk.", &other, &computed, &n_tok));
    CHECK(computed == 1 && n_tok > 0 && cb_session_n_past(small) == 0);
  }
  free(long_chunk);
  cb_session_free(small);

  /* Flash: added chunks are written at once, survive closing the cache, and
   * are hits for the request; contains counts as a lookup in the stats. */
  cb_chunk_cache_free(cache);
  cache = NULL;
  made_dir = mkdtemp(dir) != NULL;
  CHECK(made_dir);
  if (!made_dir) goto done;
  CHECK_OK(cb_chunk_cache_open(dir, NULL, &cache));
  if (cache == NULL) goto done;
  for (i = 0; i < 2; ++i) {
    computed = -1;
    CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[i], &ro, &computed, NULL));
    CHECK(computed == 1);
    CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[i], &ro, &found));
    CHECK(found == 1);
  }
  CHECK_OK(cb_chunk_cache_flush(cache));
  cb_chunk_cache_free(cache);
  cache = NULL;
  CHECK_OK(cb_chunk_cache_open(dir, NULL, &cache));
  if (cache == NULL) goto done;
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 2 && cs.hits == 0 && cs.misses == 0);
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[1], &ro, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_contains(m, cache, "not ingested", &ro, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.hits == 1 && cs.misses == 1);
  computed = -1;
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[0], &ro, &computed, NULL));
  CHECK(computed == 0);
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0 && st.bytes_read > 0);
  CHECK(strstr(c.text, "4721") != NULL);
  /* Removal on flash deletes the entry, also across a reopen. */
  CHECK_OK(cb_chunk_cache_remove(m, cache, kRagChunks[0], &ro, &found));
  CHECK(found == 1);
  cb_chunk_cache_free(cache);
  cache = NULL;
  CHECK_OK(cb_chunk_cache_open(dir, NULL, &cache));
  if (cache == NULL) goto done;
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 1);
  CHECK_OK(cb_chunk_cache_contains(m, cache, kRagChunks[0], &ro, &found));
  CHECK(found == 0);

done:
  cb_session_free(s);
  cb_chunk_cache_free(cache);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (made_dir) CHECK(system(cmd) == 0);
}

/* A token callback that misuses its own session: calls into it (refused)
 * and frees it after `free_at` tokens (carried out when cb_generate
 * returns). */
typedef struct {
  cb_session* session;
  int n_tokens;
  int free_at;
  cb_status reentry;
  int reentry_message_ok;
} misuse_ctx;

static int misuse_session(int32_t token, const char* piece, size_t piece_len, void* user) {
  misuse_ctx* c = (misuse_ctx*)user;
  (void)token;
  (void)piece;
  (void)piece_len;
  ++c->n_tokens;
  if (c->n_tokens == 1) {
    c->reentry = cb_session_reset(c->session);
    c->reentry_message_ok = strstr(cb_last_error(), "callback") != NULL;
  }
  if (c->n_tokens == c->free_at) cb_session_free(c->session);
  return 0;
}

#define CHECK_NOT_LIVE(expr)                            \
  do {                                                  \
    CHECK_ERR(expr, CB_ERR_INVALID_ARGUMENT);           \
    CHECK(strstr(cb_last_error(), "not live") != NULL); \
  } while (0)

/* Handles that are freed, freed twice, or of another type are refused with
 * CB_ERR_INVALID_ARGUMENT and never touched (ASan would see it); a second
 * free is ignored.  `m` is the suite's model; another one is loaded (and
 * freed) from `path`. */
static void test_handles(cb_model* m, const char* path) {
  cb_model* m2 = NULL;
  cb_model* dead_m = NULL;
  cb_session* s = NULL;
  cb_session* dead_s = NULL;
  cb_chunk_cache* c = NULL;
  cb_chunk_cache* dead_c = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_generate_stats gs;
  cb_model_info info;
  cb_chunk_cache_stats cs;
  misuse_ctx ctx;
  const float* logits = NULL;
  size_t n = 0, nv = 0;
  int32_t ids[64], found = -1;
  int not_a_handle = 0;
  char buf[64];
  char* question;

  cb_session_options_init(&so);
  so.n_ctx = 96;
  so.n_threads = 2;
  cb_generate_options_init(&go);
  go.max_tokens = 2;
  cb_model_info_init(&info);
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_tokenize(m, "Once upon a time", CB_NUL_TERMINATED, 1, 0, ids, 64, &n));
  CHECK_OK(cb_session_create(m, &so, &s));
  CHECK_OK(cb_chunk_cache_create(&c));
  if (s == NULL || c == NULL) goto done;

  /* A freed session. */
  CHECK_OK(cb_session_create(m, &so, &dead_s));
  cb_session_free(dead_s);
  CHECK_NOT_LIVE(cb_session_reset(dead_s));
  CHECK_NOT_LIVE(cb_session_prefill(dead_s, ids, n));
  CHECK_NOT_LIVE(cb_generate(dead_s, ids, n, &go, NULL, NULL, NULL));
  CHECK_NOT_LIVE(cb_session_logits(dead_s, &logits, &nv));
  CHECK_NOT_LIVE(cb_rag_prefill(dead_s, c, kRagChunks, 2, kRagQuestion, NULL, NULL));
  CHECK_NOT_LIVE(cb_chunk_cache_add(dead_s, c, kRagChunks[0], NULL, NULL, NULL));
  CHECK(cb_session_n_past(dead_s) == 0 && cb_session_n_ctx(dead_s) == 0);
  cb_session_free(dead_s); /* a second free is ignored */

  /* A freed chunk cache. */
  CHECK_OK(cb_chunk_cache_create(&dead_c));
  cb_chunk_cache_free(dead_c);
  CHECK_NOT_LIVE(cb_chunk_cache_clear(dead_c));
  CHECK_NOT_LIVE(cb_chunk_cache_flush(dead_c));
  CHECK_NOT_LIVE(cb_chunk_cache_get_stats(dead_c, &cs));
  CHECK_NOT_LIVE(cb_chunk_cache_contains(m, dead_c, kRagChunks[0], NULL, &found));
  CHECK_NOT_LIVE(cb_chunk_cache_add(s, dead_c, kRagChunks[0], NULL, NULL, NULL));
  CHECK_NOT_LIVE(cb_rag_prefill(s, dead_c, kRagChunks, 2, kRagQuestion, NULL, NULL));
  CHECK(cb_session_n_past(s) == 0);
  cb_chunk_cache_free(dead_c);

  /* A freed model that no session holds. */
  CHECK_OK(cb_model_load(path, NULL, &dead_m));
  cb_model_free(dead_m);
  CHECK_NOT_LIVE(cb_model_get_info(dead_m, &info));
  CHECK_NOT_LIVE(cb_tokenize(dead_m, "hi", CB_NUL_TERMINATED, 1, 0, ids, 64, &n));
  CHECK_NOT_LIVE(cb_detokenize(dead_m, ids, 1, 0, buf, sizeof buf, &n));
  CHECK_NOT_LIVE(cb_token_to_piece(dead_m, ids[0], 0, buf, sizeof buf, &n));
  CHECK_NOT_LIVE(cb_chat_format(dead_m, NULL, 0, 1, buf, sizeof buf, &n));
  CHECK_NOT_LIVE(cb_session_create(dead_m, &so, &dead_s));
  CHECK_NOT_LIVE(cb_chunk_cache_contains(dead_m, c, kRagChunks[0], NULL, &found));
  CHECK(cb_token_bos(dead_m) == -1 && cb_token_eos(dead_m) == -1);
  CHECK(cb_token_is_end_of_generation(dead_m, 0) == 0);
  cb_model_free(dead_m);

  /* Another handle type, or no handle at all, where a handle is expected;
   * a free of one is ignored and the real handles still work. */
  CHECK_NOT_LIVE(cb_model_get_info((cb_model*)s, &info));
  CHECK_NOT_LIVE(cb_tokenize((const cb_model*)c, "hi", CB_NUL_TERMINATED, 1, 0, ids, 64, &n));
  CHECK_NOT_LIVE(cb_session_reset((cb_session*)m));
  CHECK_NOT_LIVE(cb_session_prefill((cb_session*)c, ids, 1));
  CHECK_NOT_LIVE(cb_chunk_cache_clear((cb_chunk_cache*)m));
  CHECK_NOT_LIVE(cb_chunk_cache_get_stats((cb_chunk_cache*)s, &cs));
  CHECK_NOT_LIVE(cb_session_reset((cb_session*)&not_a_handle));
  CHECK(cb_session_n_ctx((cb_session*)m) == 0);
  cb_session_free((cb_session*)m);
  cb_model_free((cb_model*)s);
  cb_chunk_cache_free((cb_chunk_cache*)m);
  cb_model_free((cb_model*)&not_a_handle);
  CHECK_OK(cb_model_get_info(m, &info));
  CHECK(cb_session_n_ctx(s) == 96);
  CHECK_OK(cb_chunk_cache_get_stats(c, &cs));

  /* A question longer than the context: refused before any work. */
  question = (char*)malloc(4000);
  if (question != NULL) {
    size_t i;
    question[0] = '\0';
    for (i = 0; i < 60; ++i) strcat(question, "Why is the sky blue? ");
    CHECK_ERR(cb_rag_prefill(s, c, kRagChunks, 1, question, NULL, NULL), CB_ERR_CONTEXT_OVERFLOW);
    CHECK(strstr(cb_last_error(), "question") != NULL);
    CHECK(cb_session_n_past(s) == 0);
    free(question);
  }

  /* The model freed by the app while a session holds it: the handle is dead
   * for the app, the session works on. */
  CHECK_OK(cb_model_load(path, NULL, &m2));
  if (m2 != NULL) {
    cb_session* s2 = NULL;
    CHECK_OK(cb_session_create(m2, &so, &s2));
    cb_model_free(m2);
    CHECK_NOT_LIVE(cb_session_create(m2, &so, &dead_s));
    CHECK_NOT_LIVE(cb_model_get_info(m2, &info));
    if (s2 != NULL) {
      CHECK_OK(cb_generate(s2, ids, 3, &go, NULL, NULL, NULL));
      CHECK_OK(cb_session_reset(s2));
      CHECK_OK(cb_chunk_cache_add(s2, c, kRagChunks[0], NULL, NULL, NULL));
      /* The session's callback calls into the session (refused), then
       * frees it: generation stops there, and the handle is dead. */
      memset(&ctx, 0, sizeof ctx);
      ctx.session = s2;
      ctx.free_at = 2;
      ctx.reentry = CB_OK;
      go.max_tokens = 8;
      go.stop_at_end_of_generation = 0;
      cb_generate_stats_init(&gs);
      CHECK_ERR(cb_generate(s2, ids, n, &go, misuse_session, &ctx, &gs), CB_ERR_CANCELLED);
      CHECK(strstr(cb_last_error(), "freed") != NULL);
      CHECK(ctx.reentry == CB_ERR_INVALID_ARGUMENT && ctx.reentry_message_ok);
      CHECK(ctx.n_tokens == 2 && gs.n_generated == 2 && gs.stop_reason == CB_STOP_CANCELLED);
      CHECK(cb_session_n_ctx(s2) == 0);
      CHECK_NOT_LIVE(cb_session_reset(s2));
      cb_session_free(s2); /* already freed: ignored */
    }
  }

done:
  cb_session_free(s);
  cb_chunk_cache_free(c);
}

static void test_rag(cb_model* m) {
  cb_model_info info;
  cb_chunk_cache* cache = NULL;
  cb_chunk_cache_stats cs;
  cb_session* s = NULL;
  cb_session_options so;
  cb_rag_options ro;
  cb_rag_stats st, st_full;
  collector c, c_full;
  float *l_full = NULL, *l_mode = NULL;
  const float* lp = NULL;
  size_t nv = 0;
  cb_check_layer sched[2];

  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  CHECK(strcmp(cb_mode_name(CB_MODE_BLEND), "blend") == 0);
  CHECK(strcmp(cb_mode_name(CB_MODE_FULL), "full") == 0);
  CHECK(strcmp(cb_mode_name((cb_mode)99), "unknown") == 0);

  CHECK_ERR(cb_chunk_cache_create(NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_OK(cb_chunk_cache_create(&cache));
  cb_session_options_init(&so);
  so.n_threads = 2;
  so.n_ctx = 512;
  CHECK_OK(cb_session_create(m, &so, &s));
  l_full = (float*)malloc((size_t)info.n_vocab * sizeof(float));
  l_mode = (float*)malloc((size_t)info.n_vocab * sizeof(float));
  if (cache == NULL || s == NULL || l_full == NULL || l_mode == NULL) goto done;

  cb_rag_options_init(&ro);
  CHECK(ro.struct_size == sizeof ro && ro.mode == CB_MODE_BLEND && ro.ratio == 0.2f);
  CHECK(ro.select == CB_SELECT_DEFAULT && strcmp(cb_select_name(ro.select), "lookahead") == 0);
  CHECK(strcmp(cb_select_name(CB_SELECT_HKVD), "hkvd") == 0 &&
        strcmp(cb_select_name((cb_select)99), "unknown") == 0);
  CHECK(ro.sink_tokens == 0 && ro.guard_share == 0.0f && ro.guard_max_ratio == 0.5f);
  CHECK(ro.chunk_head == CB_CHUNK_HEAD_PROMPT && ro.schedule == NULL && ro.n_schedule == 0);
  CHECK_ERR(cb_session_logits(s, &lp, &nv), CB_ERR_INVALID_ARGUMENT); /* nothing yet */

  /* FULL (the reference), without a cache. */
  ro.mode = CB_MODE_FULL;
  cb_rag_stats_init(&st_full);
  CHECK_OK(rag_answer(s, NULL, &ro, &st_full, &c_full, l_full, info.n_vocab));
  printf("rag full:  \"%s\" (%d tokens, %.1f ms)\n", c_full.text, st_full.n_tokens,
         st_full.fuse_ms);
  CHECK(strstr(c_full.text, "4721") != NULL);
  CHECK(st_full.n_tokens > 30 && st_full.n_reused == 0 && st_full.cache_hits == 0 &&
        st_full.cache_misses == 0);
  CHECK(st_full.ratio == 1.0f && fabs(st_full.computed_fraction - 1.0) < 1e-9);
  CHECK(st_full.fuse_ms > 0.0 && st_full.total_ms >= st_full.fuse_ms);

  /* BLEND: first call computes both chunks, the second finds them. */
  ro.mode = CB_MODE_BLEND;
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_mode, info.n_vocab));
  printf("rag blend: \"%s\" (reused %d, computed %.3f, precompute %.1f ms, fuse %.1f ms)\n", c.text,
         st.n_reused, st.computed_fraction, st.precompute_ms, st.fuse_ms);
  CHECK(strstr(c.text, "4721") != NULL);
  CHECK(st.cache_misses == 2 && st.cache_hits == 0 && st.precompute_ms > 0.0);
  CHECK(st.n_tokens == st_full.n_tokens && st.n_reused > 0 && st.n_reused < st.n_tokens);
  CHECK(st.ratio == 0.2f && st.computed_fraction > 0.0 && st.computed_fraction < 1.0);
  CHECK(st.selected_share > 0.0 && st.selected_share <= 1.0 && st.guard_raised == 0);
  CHECK(cb_session_n_past(s) == st.n_tokens + c.n_tokens);
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 2 && cs.bytes > 0);

  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_mode, info.n_vocab));
  CHECK(strstr(c.text, "4721") != NULL);
  CHECK(st.cache_misses == 0 && st.cache_hits == 2 && st.precompute_ms == 0.0);
  CHECK(argmax(l_mode, info.n_vocab) == argmax(l_full, info.n_vocab));

  /* The logits after a prefill are those generation starts from. */
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL));
  CHECK(cb_session_n_past(s) == st.n_tokens);
  CHECK_OK(cb_session_logits(s, &lp, &nv));
  CHECK(nv == (size_t)info.n_vocab);
  {
    cb_generate_options go;
    collector one;
    int32_t first = -1;
    cb_generate_options_init(&go);
    go.max_tokens = 1;
    memset(&one, 0, sizeof one);
    first = argmax(lp, info.n_vocab);
    CHECK_OK(cb_generate(s, NULL, 0, &go, collect, &one, NULL));
    CHECK(one.n_tokens == 1 && one.first_token == first); /* greedy: their argmax */
    CHECK(cb_session_n_past(s) == st.n_tokens + 1);
    /* A token is pending: no logits to give. */
    CHECK_ERR(cb_session_logits(s, &lp, &nv), CB_ERR_INVALID_ARGUMENT);
  }

  /* BLEND at ratio 1 reproduces FULL; PREFIX is exact. */
  ro.ratio = 1.0f;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_mode, info.n_vocab));
  CHECK(rel_l2(l_mode, l_full, info.n_vocab) < 1e-3);
  CHECK(strcmp(c.text, c_full.text) == 0);
  ro.ratio = 0.15f;
  ro.mode = CB_MODE_PREFIX;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_mode, info.n_vocab));
  printf("rag prefix: \"%s\" (reused %d, computed %.3f)\n", c.text, st.n_reused,
         st.computed_fraction);
  CHECK(st.cache_misses == 0 && st.n_reused > 0 && st.ratio == 0.0f);
  CHECK(rel_l2(l_mode, l_full, info.n_vocab) < 1e-3);
  CHECK(strcmp(c.text, c_full.text) == 0);

  /* REUSE: every chunk reused, nothing recomputed but head and question. */
  ro.mode = CB_MODE_REUSE;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  printf("rag reuse: \"%s\" (reused %d, computed %.3f)\n", c.text, st.n_reused,
         st.computed_fraction);
  CHECK(st.cache_hits == 2 && st.cache_misses == 0 && st.ratio == 0.0f);
  CHECK(st.computed_fraction < 1.0 && st.n_reused > 0);

  /* Gradual filtering. */
  ro.mode = CB_MODE_BLEND;
  sched[0].layer = 1;
  sched[0].ratio = 0.3f;
  sched[1].layer = 3;
  sched[1].ratio = 0.15f;
  ro.schedule = sched;
  ro.n_schedule = 2;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  printf("rag blend [(1,0.3),(3,0.15)]: \"%s\" (computed %.3f)\n", c.text, st.computed_fraction);
  CHECK(strstr(c.text, "4721") != NULL);
  CHECK(st.ratio == 0.3f && st.cache_misses == 0);
  ro.schedule = NULL;
  ro.n_schedule = 0;

  /* Another namespace or chunk head does not see these entries. */
  ro.cache_namespace = "another-app";
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  CHECK(st.cache_misses == 2 && st.cache_hits == 0);
  ro.cache_namespace = NULL;
  ro.chunk_head = CB_CHUNK_HEAD_NONE;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, NULL, 0));
  CHECK(st.cache_misses == 2 && st.cache_hits == 0);
  ro.chunk_head = CB_CHUNK_HEAD_PROMPT;
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 6);

  /* Invalid UTF-8 in a chunk and in the question is tokenized byte-wise. */
  {
    const char* odd[2] = {"caf\xc3 \xff\xfe broken \xe2\x82 bytes", "\xc0\xaf plain"};
    CHECK_OK(cb_session_reset(s));
    CHECK_OK(cb_rag_prefill(s, cache, odd, 2, "what \xff?", &ro, NULL));
  }

  /* Misuse. */
  CHECK_OK(cb_session_reset(s));
  CHECK_ERR(cb_rag_prefill(NULL, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_rag_prefill(s, cache, NULL, 2, kRagQuestion, &ro, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 0, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "no chunks") != NULL);
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, NULL, &ro, NULL), CB_ERR_INVALID_ARGUMENT);
  {
    const char* with_null[2] = {"a chunk", NULL};
    CHECK_ERR(cb_rag_prefill(s, cache, with_null, 2, kRagQuestion, &ro, NULL),
              CB_ERR_INVALID_ARGUMENT);
  }
  CHECK_ERR(cb_rag_prefill(s, NULL, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT); /* BLEND needs a cache */
  ro.ratio = 1.5f;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "ratio") != NULL);
  ro.ratio = -0.1f;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  ro.mode = CB_MODE_FULL; /* checked in every mode */
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  ro.mode = CB_MODE_BLEND;
  ro.ratio = (float)NAN;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  ro.ratio = 0.15f;
  sched[1].layer = info.n_layer; /* one past the last layer */
  ro.schedule = sched;
  ro.n_schedule = 2;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "layer") != NULL);
  sched[1].layer = 3;
  sched[1].ratio = 0.5f; /* grows along the schedule */
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  ro.schedule = NULL; /* with n_schedule 2 */
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.mode = (cb_mode)17;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.chunk_head = (cb_chunk_head)9;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.select = (cb_select)42;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "select") != NULL);
  cb_rag_options_init(&ro);
  ro.sink_tokens = -1;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.guard_share = 1.5f;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.guard_max_ratio = (float)NAN;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(cb_session_n_past(s) == 0);
  /* A caller built against the struct before `select` still works, with
   * the defaults for the fields it lacks. */
  cb_rag_options_init(&ro);
  ro.struct_size = offsetof(cb_rag_options, select);
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL));
  CHECK_OK(cb_session_reset(s));
  cb_rag_options_init(&ro);
  ro.struct_size = 4;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_stats_init(&st);
  st.struct_size = 1;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, NULL, &st),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(cb_session_n_past(s) == 0);
  /* A session that is not empty. */
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, NULL, NULL));
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, NULL, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "reset the session") != NULL);
  CHECK_ERR(cb_session_logits(NULL, &lp, &nv), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_logits(s, NULL, &nv), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_logits(s, &lp, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_get_stats(NULL, &cs), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_get_stats(cache, NULL), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_clear(NULL), CB_ERR_INVALID_ARGUMENT);
  cb_chunk_cache_free(NULL);

  /* Longer than the context: one chunk, then the whole request. */
  {
    cb_session* small = NULL;
    char long_chunk[2048];
    const char* one[1];
    const char* many[3];
    size_t i;
    cb_session_options_init(&so);
    so.n_threads = 2;
    so.n_ctx = 80;
    CHECK_OK(cb_session_create(m, &so, &small));
    long_chunk[0] = '\0';
    for (i = 0; i < 30; ++i) strcat(long_chunk, "The river flows to the sea. ");
    one[0] = long_chunk;
    if (small != NULL) {
      cb_rag_options_init(&ro);
      CHECK_ERR(cb_rag_prefill(small, cache, one, 1, kRagQuestion, &ro, NULL),
                CB_ERR_CONTEXT_OVERFLOW);
      CHECK(strstr(cb_last_error(), "chunk 0") != NULL);
      CHECK(cb_session_n_past(small) == 0);
      many[0] = kRagChunks[0];
      many[1] = kRagChunks[1];
      many[2] = kRagChunks[1];
      CHECK_ERR(cb_rag_prefill(small, cache, many, 3, kRagQuestion, &ro, NULL),
                CB_ERR_CONTEXT_OVERFLOW);
      CHECK(strstr(cb_last_error(), "request") != NULL);
      ro.mode = CB_MODE_FULL;
      CHECK_ERR(cb_rag_prefill(small, NULL, many, 3, kRagQuestion, &ro, NULL),
                CB_ERR_CONTEXT_OVERFLOW);
      CHECK(cb_session_n_past(small) == 0);
      /* ... and the session still works. */
      CHECK_OK(cb_rag_prefill(small, NULL, kRagChunks, 1, kRagQuestion, &ro, NULL));
      cb_session_free(small);
    }
  }

  CHECK_OK(cb_chunk_cache_clear(cache));
  CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
  CHECK(cs.n_entries == 0 && cs.bytes == 0);

done:
  free(l_full);
  free(l_mode);
  cb_session_free(s);
  cb_chunk_cache_free(cache);
}

int main(void) {
  const char* path = getenv("CB_MODEL");
  cb_model* m = NULL;
  cb_model_options mo;
  if (path == NULL || path[0] == '\0') path = CB_DEFAULT_MODEL;
  printf("cacheblend %s, model %s\n", cb_version(), path);

  test_version_and_status();
  test_load_errors(path);
  test_error_messages_are_escaped();

  cb_model_options_init(&mo);
  mo.n_threads = 2;
  CHECK_OK(cb_model_load(path, &mo, &m));
  if (m != NULL) {
    test_model_info(m);
    test_tokens(m);
    test_chat_format_errors(m);
    test_generate(m);
    test_generation_controls(m);
    test_context_limits(m);
    test_threads(m);
    test_concurrent_use_of_one_session(m);
    test_rag(m);
    test_abort_callback(m);
    test_rag_store(m);
    test_chunk_cache_add(m);
    test_handles(m, path);
    cb_model_free(m);
    test_lifetime(path);
  }

  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
