/* The C API: the abort callback, and RAG prefills over a chunk cache on
 * flash (stored chunks, corrupt files, read caps) and in storage tiers.
 * Chunks added ahead of time: test_c_api_chunk_cache.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_api_test.h"

/* ------------------------------------------------------------------------ */
/* Retrieval-augmented prefill                                                */

/* The answer is in the second chunk, whose cached KV (computed without the
 * first chunk before it) is what blending has to correct. */
const char* const kRagChunks[2] = {
    "The museum opens at nine in the morning and closes at five in the evening.",
    "The secret code of the vault is 4721. Only the bank manager knows it."};
const char* const kRagQuestion = "What is the secret code of the vault?";

size_t lighthouse_text(cb_model* m, int copies, char* text, int32_t* ids) {
  size_t n = 0;
  int i;
  text[0] = '\0';
  for (i = 0; i < copies; ++i)
    strcat(text, "The lighthouse keeper counted the ships that passed in the night. ");
  CHECK_OK(cb_tokenize(m, text, strlen(text), 1, 0, ids, 400, &n));
  return n;
}

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
void test_abort_callback(cb_model* m) {
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
  char text[4096];
  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  n = lighthouse_text(m, 16, text, ids);
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

/* The abort callback frees its session (as Python's close() may) and lets
 * the work go on: the call stops there with CB_ERR_CANCELLED, and the
 * session is deleted when the call returns (ASan sees any later use). */
typedef struct {
  cb_session* s;
  int calls;
  int free_at;
} freeing_abort;

static int free_session_and_go_on(void* user) {
  freeing_abort* f = (freeing_abort*)user;
  if (++f->calls == f->free_at) cb_session_free(f->s);
  return 0;
}

void test_free_from_abort_callback(cb_model* m) {
  cb_session_options so;
  cb_chunk_cache* cache = NULL;
  cb_rag_options ro;
  int32_t ids[400];
  size_t n = 0;
  int which;
  char text[4096];
  n = lighthouse_text(m, 8, text, ids);
  CHECK_OK(cb_chunk_cache_create(&cache));
  if (cache == NULL) return;
  cb_session_options_init(&so);
  so.n_ctx = 512;
  so.n_batch = 32; /* several batches: work goes on after the free */
  cb_rag_options_init(&ro);
  for (which = 0; which < 3; ++which) {
    cb_session* s = NULL;
    freeing_abort f;
    cb_status status = CB_OK;
    CHECK_OK(cb_session_create(m, &so, &s));
    if (s == NULL) break;
    memset(&f, 0, sizeof f);
    f.s = s;
    f.free_at = 5;
    CHECK_OK(cb_session_set_abort_callback(s, free_session_and_go_on, &f));
    if (which == 0) {
      status = cb_session_prefill(s, ids, n);
    } else if (which == 1) {
      status = cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL);
    } else {
      status = cb_chunk_cache_add(s, cache, text, &ro, NULL, NULL);
    }
    if (status != CB_ERR_CANCELLED)
      fprintf(stderr, "free from the abort callback, call %d: %d (%s)\n", which, (int)status,
              cb_last_error());
    CHECK(status == CB_ERR_CANCELLED);
    CHECK(f.calls == f.free_at);
    CHECK(cb_session_n_ctx(s) == 0); /* not live */
    cb_session_free(s);              /* already freed: ignored */
  }
  cb_chunk_cache_free(cache);
}

/* A copy of the model at `src` with every output-norm weight NaN (all bits
 * set, a NaN as f32 and as f16), written to `dst`: every logit is NaN.  The
 * GGUF header is read as far as the tensor infos; 0 on failure. */
static int read_u(FILE* f, void* v, size_t n) {
  return fread(v, 1, n, f) == n;
}
static int skip_string(FILE* f) {
  uint64_t len;
  return read_u(f, &len, 8) && fseek(f, (long)len, SEEK_CUR) == 0;
}
static int skip_value(FILE* f, uint32_t type) {
  static const int kSize[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  if (type == 8) return skip_string(f);
  if (type == 9) {
    uint32_t elem;
    uint64_t n, i;
    if (!read_u(f, &elem, 4) || !read_u(f, &n, 8)) return 0;
    if (elem == 8) {
      for (i = 0; i < n; ++i)
        if (!skip_string(f)) return 0;
      return 1;
    }
    return elem < 13 && kSize[elem] > 0 &&
           fseek(f, (long)(n * (uint64_t)kSize[elem]), SEEK_CUR) == 0;
  }
  return type < 13 && kSize[type] > 0 && fseek(f, kSize[type], SEEK_CUR) == 0;
}
static int write_nan_model(const char* src, const char* dst) {
  FILE* in = fopen(src, "rb");
  FILE* out = NULL;
  uint32_t magic, version, alignment = 32;
  uint64_t n_tensors, n_kv, i, norm_offset = 0, norm_bytes = 0;
  long data_start;
  char buf[1 << 16];
  size_t got;
  int ok = 0;
  if (in == NULL) return 0;
  if (!read_u(in, &magic, 4) || !read_u(in, &version, 4) || !read_u(in, &n_tensors, 8) ||
      !read_u(in, &n_kv, 8))
    goto done;
  for (i = 0; i < n_kv; ++i) {
    uint64_t len;
    uint32_t type;
    char key[64] = "";
    if (!read_u(in, &len, 8)) goto done;
    if (len < sizeof key) {
      if (!read_u(in, key, (size_t)len)) goto done;
    } else if (fseek(in, (long)len, SEEK_CUR) != 0) {
      goto done;
    }
    if (!read_u(in, &type, 4)) goto done;
    if (strcmp(key, "general.alignment") == 0 && type == 4) {
      if (!read_u(in, &alignment, 4)) goto done;
    } else if (!skip_value(in, type)) {
      goto done;
    }
  }
  for (i = 0; i < n_tensors; ++i) {
    uint64_t len, dims[4], offset, n_el = 1;
    uint32_t n_dims, type, d;
    char name[128] = "";
    if (!read_u(in, &len, 8) || len >= sizeof name || !read_u(in, name, (size_t)len) ||
        !read_u(in, &n_dims, 4) || n_dims > 4 || !read_u(in, dims, 8 * (size_t)n_dims) ||
        !read_u(in, &type, 4) || !read_u(in, &offset, 8))
      goto done;
    for (d = 0; d < n_dims; ++d) n_el *= dims[d];
    if (strcmp(name, "output_norm.weight") == 0 && (type == 0 || type == 1)) {
      norm_offset = offset;
      norm_bytes = n_el * (type == 0 ? 4 : 2);
    }
  }
  if (norm_bytes == 0) goto done;
  data_start = ftell(in);
  data_start = (data_start + (long)alignment - 1) / (long)alignment * (long)alignment;
  out = fopen(dst, "wb");
  if (out == NULL || fseek(in, 0, SEEK_SET) != 0) goto done;
  while ((got = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, got, out) != got) goto done;
  if (fseek(out, data_start + (long)norm_offset, SEEK_SET) != 0) goto done;
  memset(buf, 0xFF, sizeof buf);
  ok = norm_bytes <= sizeof buf && fwrite(buf, 1, (size_t)norm_bytes, out) == norm_bytes;
done:
  if (out != NULL && fclose(out) != 0) ok = 0;
  fclose(in);
  return ok;
}

/* A model whose logits are all NaN: cb_rag_prefill refuses them as
 * cb_generate does (CB_ERR_FORMAT), in every mode, and leaves the session
 * empty. */
void test_nan_logits(const char* path) {
  char nan_path[256];
  cb_model* m = NULL;
  cb_session* s = NULL;
  cb_chunk_cache* cache = NULL;
  cb_session_options so;
  cb_rag_options ro;
  int32_t ids[64];
  size_t n = 0;
  int mode;
  const char* tmp = getenv("TMPDIR");
  snprintf(nan_path, sizeof nan_path, "%s/cb_nan_model_%ld.gguf",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", (long)getpid());
  CHECK(write_nan_model(path, nan_path));
  CHECK_OK(cb_model_load(nan_path, NULL, &m));
  if (m == NULL) goto done;
  cb_session_options_init(&so);
  so.n_ctx = 256;
  CHECK_OK(cb_session_create(m, &so, &s));
  CHECK_OK(cb_chunk_cache_create(&cache));
  if (s == NULL || cache == NULL) goto done;
  CHECK_OK(cb_tokenize(m, "Hello", 5, 1, 0, ids, 64, &n));
  CHECK_ERR(cb_generate(s, ids, n, NULL, NULL, NULL, NULL), CB_ERR_FORMAT);
  CHECK(strstr(cb_last_error(), "non-finite logits") != NULL);
  for (mode = CB_MODE_FULL; mode <= CB_MODE_BLEND; ++mode) {
    CHECK_OK(cb_session_reset(s));
    cb_rag_options_init(&ro);
    ro.mode = (cb_mode)mode;
    CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL), CB_ERR_FORMAT);
    CHECK(strstr(cb_last_error(), "non-finite logits") != NULL);
    CHECK(cb_session_n_past(s) == 0);
  }
done:
  cb_session_free(s);
  cb_chunk_cache_free(cache);
  cb_model_free(m);
  remove(nan_path);
}

/* One RAG request on the reset session `s`, then greedy generation of up
 * to 12 tokens into `out`; the first-token logits are copied to `logits`
 * (n_vocab floats) when not NULL. */
cb_status rag_answer(cb_session* s, cb_chunk_cache* cache, const cb_rag_options* ro,
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

int32_t argmax(const float* v, int32_t n) {
  int32_t i, best = 0;
  for (i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

/* ||a - b|| / ||b|| */
double rel_l2(const float* a, const float* b, int32_t n) {
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
void test_rag_store(cb_model* m) {
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
  CHECK(st.fetch_ms > 0.0 && st.fetch_ms <= st.load_ms);
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
  CHECK(st.upload_ms == -7.0);
  /* A GPU session may hold the chunks in device memory since the request
   * before (resident_hits, past this struct's end): nothing read then. */
  if (strcmp(backend_of(m), "cpu") == 0) CHECK(st.bytes_read > 0);
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

/* Storage tiers: RAM (budget) + flash + a slow directory + a Redis server
 * that is not there.  The request answers the same, the second one from the
 * RAM tier; the absent server costs misses, not errors; bad tier options are
 * refused with a message. */
void test_rag_tiers(cb_model* m) {
  char dir[] = "/tmp/cb_c_api_tiers.XXXXXX";
  char slow[160], cmd[400];
  cb_chunk_cache* cache = NULL;
  cb_store_options so;
  cb_session_options sess_o;
  cb_session* s = NULL;
  cb_rag_options ro;
  cb_rag_stats st;
  collector c1, c2;

  CHECK(mkdtemp(dir) != NULL);
  snprintf(slow, sizeof slow, "%s/sd", dir);
  cb_store_options_init(&so);
  CHECK(so.ram_budget_bytes == 0 && so.slow_dir == NULL && so.redis_address == NULL);
  CHECK(so.redis_timeout_ms > 0);
  so.redis_address = "127.0.0.1:notaport";
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "port") != NULL);
  so.redis_address = "rediss://127.0.0.1:6380";
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "TLS") != NULL);
  /* A mistyped URL: the message names the address, never its password. */
  so.redis_address = "redis://app:hunter2pw@127.0.0.1:63z79";
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "port") != NULL);
  CHECK(strstr(cb_last_error(), "hunter2pw") == NULL);
  so.redis_address = NULL;
  so.redis_password = "secret";
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  so.redis_password = NULL;
  so.slow_dir = "";
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  so.slow_dir = NULL;
  CHECK(so.placement_ratio > 0.19f && so.placement_ratio < 0.21f);
  so.placement_ratio = 1.5f;
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "placement_ratio") != NULL);
  CHECK(cache == NULL);

  cb_store_options_init(&so);
  so.ram_budget_bytes = (uint64_t)256 << 20;
  so.slow_dir = slow;
  so.slow_read_bytes_per_sec = 10000000;
  so.redis_address = "127.0.0.1:1"; /* nothing listens there */
  so.redis_timeout_ms = 200;
#if !CB_WITH_REDIS
  /* A build without the Redis tier refuses an address by name. */
  CHECK_ERR(cb_chunk_cache_open(dir, &so, &cache), CB_ERR_UNSUPPORTED);
  CHECK(strstr(cb_last_error(), "Redis") != NULL && cache == NULL);
  so.redis_address = NULL;
#endif
  CHECK_OK(cb_chunk_cache_open(dir, &so, &cache));

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
  {
    /* Per-tier counters: every tier named, fastest first; the two hits of
     * the second request served by local tiers, the absent server failing. */
    static const char* const names[] = {"ram", "flash", "slow", "redis"};
    const size_t want_tiers = CB_WITH_REDIS ? 4 : 3;
    size_t n_tiers = 0, i;
    uint64_t hits = 0, placed = 0;
    cb_tier_stats ts;
    CHECK_OK(cb_chunk_cache_n_tiers(cache, &n_tiers));
    CHECK(n_tiers == want_tiers);
    for (i = 0; i < n_tiers && i < want_tiers; ++i) {
      cb_tier_stats_init(&ts);
      CHECK_OK(cb_chunk_cache_get_tier_stats(cache, i, &ts));
      CHECK(ts.struct_size == sizeof ts && strcmp(ts.name, names[i]) == 0);
      hits += ts.hits;
      if (i < 3) placed += ts.placed;
      if (i == 3) CHECK(ts.failures >= 1 && ts.hits == 0);
    }
    CHECK(hits == 2 && placed == 2);
    cb_tier_stats_init(&ts);
    CHECK_ERR(cb_chunk_cache_get_tier_stats(cache, want_tiers, &ts), CB_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), CB_WITH_REDIS ? "tier 4" : "tier 3") != NULL);
    ts.struct_size = 3;
    CHECK_ERR(cb_chunk_cache_get_tier_stats(cache, 0, &ts), CB_ERR_INVALID_ARGUMENT);
    CHECK_ERR(cb_chunk_cache_n_tiers(cache, NULL), CB_ERR_INVALID_ARGUMENT);
  }
  CHECK_OK(cb_chunk_cache_clear(cache));
  cb_rag_stats_init(&st);
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c2, NULL, 0));
  CHECK(st.cache_misses == 2 && st.cache_hits == 0);

  cb_session_free(s);
  cb_chunk_cache_free(cache);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}
