/* The C API: greedy chat answers, sampling and stop controls, context
 * limits, model and session lifetimes, two sessions on two threads, and one
 * session used from two threads at once. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "c_api_test.h"

void test_generate(cb_model* m) {
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
void test_generation_controls(cb_model* m) {
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

void test_context_limits(cb_model* m) {
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
  so.struct_size = offsetof(cb_session_options, kv_type) - 1; /* no header had this size */
  CHECK_ERR(cb_session_create(m, &so, &s), CB_ERR_INVALID_ARGUMENT);
  so.struct_size = sizeof(so) + 8; /* a header from the future */
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

/* The KV cache's element type: f16 by default (also for a caller built
 * before the field, whose struct ends before it), f32 on request at twice
 * the bytes, unknown values refused with a message naming the field; both
 * types answer the same greedy tokens on a short prompt. */
void test_kv_types(cb_model* m) {
  cb_session* s16 = NULL;
  cb_session* s32 = NULL;
  cb_session* old = NULL;
  cb_session* bad = NULL;
  cb_session_options so;
  cb_generate_options go;
  cb_model_info info;
  int32_t ids[128];
  collector c16, c32;
  size_t n;
  uint64_t want;

  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  want = (uint64_t)info.n_layer * 256u * 2u * (uint64_t)info.n_head_kv * (uint64_t)info.head_dim;

  cb_session_options_init(&so);
  CHECK(so.kv_type == CB_KV_F16);
  so.n_ctx = 256;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s16));
  so.kv_type = CB_KV_F32;
  CHECK_OK(cb_session_create(m, &so, &s32));
  /* The struct of a program built before kv_type: the field is not read. */
  so.struct_size = offsetof(cb_session_options, kv_type);
  so.reserved0 = 12345; /* its padding there: ignored */
  CHECK_OK(cb_session_create(m, &so, &old));
  so.struct_size = sizeof(so);
  so.reserved0 = 0;
  so.kv_type = 2;
  CHECK_ERR(cb_session_create(m, &so, &bad), CB_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL && strstr(cb_last_error(), "kv_type") != NULL);
  so.kv_type = -1;
  CHECK_ERR(cb_session_create(m, &so, &bad), CB_ERR_INVALID_ARGUMENT);
  so.kv_type = CB_KV_F16;
  CHECK(so.activations == CB_ACTIVATIONS_INT8);
  so.activations = 2;
  CHECK_ERR(cb_session_create(m, &so, &bad), CB_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL && strstr(cb_last_error(), "activations") != NULL);
  so.activations = CB_ACTIVATIONS_INT8;
  CHECK(cb_session_kv_bytes(NULL) == 0);
  if (s16 == NULL || s32 == NULL || old == NULL) goto done;
  CHECK(cb_session_kv_bytes(s16) == 2 * want);
  CHECK(cb_session_kv_bytes(s32) == 4 * want);
  CHECK(cb_session_kv_bytes(old) == 2 * want);

  n = chat_prompt(m, "What is the capital of France? Please answer in one word.", ids, 128);
  cb_generate_options_init(&go);
  go.max_tokens = 6;
  memset(&c16, 0, sizeof c16);
  memset(&c32, 0, sizeof c32);
  CHECK_OK(cb_generate(s16, ids, n, &go, collect, &c16, NULL));
  CHECK_OK(cb_generate(s32, ids, n, &go, collect, &c32, NULL));
  CHECK(c16.n_tokens > 0 && strcmp(c16.text, c32.text) == 0);
done:
  cb_session_free(s16);
  cb_session_free(s32);
  cb_session_free(old);
}

/* The session keeps the model alive after cb_model_free. */
void test_lifetime(const char* path) {
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

void test_threads(cb_model* m) {
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

void test_concurrent_use_of_one_session(cb_model* m) {
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

/* A thread that ends inside a token callback (pthread_exit; Python ends its
 * daemon threads so at exit): the library lets the unwinding through, the
 * thread ends, and the session is free again for other threads. */
typedef struct {
  cb_session* s;
  const int32_t* ids;
  size_t n;
  int tokens;
  int returned;
} exiting_thread;

static int exit_thread(int32_t token, const char* piece, size_t piece_len, void* user) {
  exiting_thread* e = (exiting_thread*)user;
  (void)token;
  (void)piece;
  (void)piece_len;
  ++e->tokens;
  pthread_exit(NULL);
  return 0;
}

static void* generate_then_exit(void* arg) {
  exiting_thread* e = (exiting_thread*)arg;
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 4;
  cb_generate(e->s, e->ids, e->n, &go, exit_thread, e, NULL);
  e->returned = 1;
  return NULL;
}

void test_thread_exit_in_callback(cb_model* m) {
  int32_t ids[256];
  exiting_thread e;
  pthread_t th;
  cb_session_options so;
  memset(&e, 0, sizeof e);
  e.n = chat_prompt(m, "What is the capital of France?", ids, 256);
  e.ids = ids;
  cb_session_options_init(&so);
  so.n_ctx = 128;
  so.n_threads = 1;
  CHECK_OK(cb_session_create(m, &so, &e.s));
  if (e.s == NULL) return;
  if (pthread_create(&th, NULL, generate_then_exit, &e) == 0) {
    pthread_join(th, NULL);
    CHECK(e.tokens == 1 && !e.returned);
    CHECK_OK(cb_session_reset(e.s));
    CHECK_OK(cb_generate(e.s, ids, e.n, NULL, NULL, NULL, NULL));
  } else {
    CHECK(0);
  }
  cb_session_free(e.s);
}

static size_t embed_text(cb_session* s, cb_model* m, const char* text, float* out, size_t cap) {
  int32_t ids[256];
  size_t n = 0;
  CHECK_OK(cb_tokenize(m, text, strlen(text), 0, 0, ids, 256, &n));
  CHECK_OK(cb_session_embed(s, ids, n, out, cap));
  return n;
}

static double dot(const float* a, const float* b, int32_t n) {
  double d = 0.0;
  for (int32_t i = 0; i < n; ++i) d += (double)a[i] * b[i];
  return d;
}

/* Pooled embeddings: unit length, the same in one batch or many, the session
 * empty afterwards, and two sentences about one thing closer than either to
 * an unrelated one. */
void test_embed(cb_model* m) {
  cb_model_info info;
  cb_session_options so;
  cb_session *s = NULL, *small = NULL;
  float a[4096], b[4096], c[4096], a7[4096];
  int32_t ids[8];
  size_t n = 0;
  const float* logits = NULL;
  size_t n_vocab = 0;
  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  CHECK(info.n_embd > 0 && info.n_embd <= 4096);
  cb_session_options_init(&so);
  so.n_ctx = 256;
  CHECK_OK(cb_session_create(m, &so, &s));
  so.n_batch = 7; /* several forward chunks for one text */
  CHECK_OK(cb_session_create(m, &so, &small));
  if (s == NULL || small == NULL) goto done;

  CHECK_OK(cb_tokenize(m, "hello", 5, 0, 0, ids, 8, &n));
  CHECK_ERR(cb_session_embed(NULL, ids, n, a, 4096), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_embed(s, NULL, n, a, 4096), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_embed(s, ids, 0, a, 4096), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_embed(s, ids, n, NULL, 4096), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_session_embed(s, ids, n, a, (size_t)info.n_embd - 1), CB_ERR_BUFFER_TOO_SMALL);

  CHECK_OK(cb_session_prefill(s, ids, n));
  embed_text(s, m, "The cat sat on the warm mat by the kitchen door.", a, 4096);
  CHECK(cb_session_n_past(s) == 0);
  CHECK_ERR(cb_session_logits(s, &logits, &n_vocab), CB_ERR_INVALID_ARGUMENT);
  CHECK(fabs(dot(a, a, info.n_embd) - 1.0) < 1e-5);
  embed_text(small, m, "The cat sat on the warm mat by the kitchen door.", a7, 4096);
  CHECK(dot(a, a7, info.n_embd) > 1.0 - 1e-4);
  embed_text(s, m, "A cat was lying on the mat next to the kitchen door.", b, 4096);
  embed_text(s, m, "Quarterly revenue grew by twelve percent in Europe.", c, 4096);
  CHECK(dot(a, b, info.n_embd) > dot(a, c, info.n_embd));
  CHECK(dot(a, b, info.n_embd) > dot(b, c, info.n_embd));
done:
  cb_session_free(s);
  cb_session_free(small);
}
