/* The C API's experimental part (cacheblend_experimental.h): neighbour-aware
 * precompute with cb_chunk_cache_add_after and when requests look for it,
 * the context scale. */
#define _POSIX_C_SOURCE 200809L
#include <cacheblend/cacheblend_experimental.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_test.h"

/* The model's info and a session of 512 positions on 2 threads (NULL when
 * it cannot be created: the check says why). */
static cb_session* open_session(cb_model* m, cb_model_info* info) {
  cb_session_options so;
  cb_session* s = NULL;
  cb_model_info_init(info);
  CHECK_OK(cb_model_get_info(m, info));
  cb_session_options_init(&so);
  so.n_ctx = 512;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &s));
  return s;
}

/* Room for one row of logits. */
static float* logits_row(const cb_model_info* info) {
  return (float*)malloc((size_t)info->n_vocab * sizeof(float));
}

/* A RAG prefill of kRagChunks[1] alone and kRagQuestion; its logits. */
static cb_status first_chunk_logits(cb_session* s, cb_chunk_cache* cache, const cb_rag_options* ro,
                                    cb_rag_stats* st, float* logits, int32_t n_vocab) {
  const float* l = NULL;
  size_t n = 0;
  cb_status status = cb_session_reset(s);
  if (status == CB_OK) status = cb_rag_prefill(s, cache, kRagChunks + 1, 1, kRagQuestion, ro, st);
  if (status == CB_OK) status = cb_session_logits(s, &l, &n);
  if (status == CB_OK && n != (size_t)n_vocab) status = CB_ERR_INTERNAL;
  if (status == CB_OK) memcpy(logits, l, n * sizeof(float));
  return status;
}

/* A chunk computed after the chunk that precedes it in the request holds the
 * KV a full prefill computes there, so REUSE then gives full prefill's
 * logits; computed alone, it does not.  Where the chunk opens a request, its
 * KV computed alone is taken instead (computed on a miss). */
void test_chunk_cache_add_after(cb_model* m) {
  cb_model_info info;
  cb_session_options so;
  cb_session *s = NULL, *small = NULL;
  cb_chunk_cache *alone = NULL, *after = NULL;
  cb_rag_options ro;
  cb_rag_stats st;
  cb_chunk_cache_stats cs;
  collector c;
  float *l_full = NULL, *l_alone = NULL, *l_after = NULL;
  int32_t n_tok = -1, found = -1, ids[8];
  size_t n = 0;
  double err_after = 1.0, err_alone = 0.0;
  char* long_context = NULL;
  int i;

  s = open_session(m, &info);
  CHECK_OK(cb_chunk_cache_create(&alone));
  CHECK_OK(cb_chunk_cache_create(&after));
  l_full = logits_row(&info);
  l_alone = logits_row(&info);
  l_after = logits_row(&info);
  if (s == NULL || alone == NULL || after == NULL || l_full == NULL || l_alone == NULL ||
      l_after == NULL)
    goto done;
  cb_rag_options_init(&ro);
  cb_rag_stats_init(&st);
  ro.mode = CB_MODE_FULL;
  CHECK_OK(rag_answer(s, alone, &ro, &st, &c, l_full, info.n_vocab));
  CHECK_OK(cb_session_reset(s));

  CHECK_OK(cb_chunk_cache_add(s, alone, kRagChunks[0], &ro, NULL, NULL));
  CHECK_OK(cb_chunk_cache_add(s, alone, kRagChunks[1], &ro, NULL, NULL));
  CHECK_OK(cb_chunk_cache_add(s, after, kRagChunks[0], &ro, NULL, NULL));
  CHECK_OK(cb_chunk_cache_add_after(s, after, kRagChunks[1], kRagChunks[0], &ro, &n_tok));
  CHECK(cb_session_n_past(s) == 0);
  CHECK_OK(cb_tokenize(m, kRagChunks[1], CB_NUL_TERMINATED, 0, 0, NULL, 0, &n));
  CHECK(n_tok > (int32_t)n); /* its text and a blank line, not the context */
  /* Apart from the KV computed alone (which contains reports); the second
   * call replaces the entry. */
  CHECK_OK(cb_chunk_cache_contains(m, after, kRagChunks[1], &ro, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_contains_after(m, after, kRagChunks[1], &ro, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_contains_after(m, after, kRagChunks[0], &ro, &found));
  CHECK(found == 0);
  CHECK_OK(cb_chunk_cache_add_after(s, after, kRagChunks[1], kRagChunks[0], &ro, NULL));
  cb_chunk_cache_stats_init(&cs);
  CHECK_OK(cb_chunk_cache_get_stats(after, &cs));
  CHECK(cs.n_entries == 2);

  ro.mode = CB_MODE_REUSE;
  CHECK_OK(rag_answer(s, alone, &ro, &st, &c, l_alone, info.n_vocab));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  CHECK_OK(rag_answer(s, after, &ro, &st, &c, l_after, info.n_vocab));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  err_alone = rel_l2(l_alone, l_full, info.n_vocab);
  err_after = rel_l2(l_after, l_full, info.n_vocab);
  printf("add_after: REUSE against FULL rel L2 %.2e (chunk computed alone %.2e)\n", err_after,
         err_alone);
  CHECK(err_after < 1e-3);
  CHECK(err_alone > 10.0 * err_after);

  /* Opening a request, the chunk misses (its KV after a context is not what
   * the request's prefix gives), and REUSE then equals FULL for it. */
  ro.mode = CB_MODE_FULL;
  CHECK_OK(first_chunk_logits(s, alone, &ro, &st, l_full, info.n_vocab));
  ro.mode = CB_MODE_REUSE;
  CHECK_OK(first_chunk_logits(s, after, &ro, &st, l_after, info.n_vocab));
  CHECK(st.cache_hits == 0 && st.cache_misses == 1);
  err_after = rel_l2(l_after, l_full, info.n_vocab);
  printf("add_after: the chunk opening a REUSE request against FULL rel L2 %.2e\n", err_after);
  CHECK(err_after < 1e-4);
  CHECK_OK(cb_chunk_cache_contains(m, after, kRagChunks[1], &ro, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_get_stats(after, &cs));
  CHECK(cs.n_entries == 3);
  /* Removing the chunk removes both of its entries. */
  found = -1;
  CHECK_OK(cb_chunk_cache_remove(m, after, kRagChunks[1], &ro, &found));
  CHECK(found == 1);
  CHECK_OK(cb_chunk_cache_get_stats(after, &cs));
  CHECK(cs.n_entries == 1);
  CHECK_OK(cb_chunk_cache_contains_after(m, after, kRagChunks[1], &ro, &found));
  CHECK(found == 0);
  found = -1;
  CHECK_ERR(cb_chunk_cache_contains_after(m, after, kRagChunks[1], &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_contains_after(m, NULL, kRagChunks[1], &ro, &found),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(found == -1);
  CHECK_OK(rag_answer(s, after, &ro, &st, &c, l_after, info.n_vocab));
  CHECK(st.cache_hits == 1 && st.cache_misses == 1);

  /* Misuse: nothing stored, outputs untouched. */
  CHECK_OK(cb_session_reset(s));
  n_tok = -7;
  CHECK_ERR(cb_chunk_cache_add_after(NULL, after, "x", "y", NULL, &n_tok), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_add_after(s, NULL, "x", "y", NULL, &n_tok), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_add_after(s, after, NULL, "y", NULL, &n_tok), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_add_after(s, after, "x", NULL, NULL, &n_tok), CB_ERR_INVALID_ARGUMENT);
  CHECK(n_tok == -7);
  CHECK_OK(cb_tokenize(m, "Hello", CB_NUL_TERMINATED, 0, 0, ids, 8, &n));
  CHECK_OK(cb_session_prefill(s, ids, n));
  CHECK_ERR(cb_chunk_cache_add_after(s, after, "new chunk", "y", NULL, NULL),
            CB_ERR_INVALID_ARGUMENT);
  /* A context that does not fit beside the chunk: an overflow that names
   * it; nothing stored, the session empty. */
  cb_session_options_init(&so);
  so.n_ctx = 64;
  so.n_threads = 2;
  CHECK_OK(cb_session_create(m, &so, &small));
  long_context = (char*)malloc(2000);
  if (small != NULL && long_context != NULL) {
    long_context[0] = '\0';
    for (i = 0; i < 40; ++i) strcat(long_context, "The vault is closed. ");
    CHECK_ERR(cb_chunk_cache_add_after(small, after, "new chunk", long_context, NULL, NULL),
              CB_ERR_CONTEXT_OVERFLOW);
    CHECK(strstr(cb_last_error(), "context") != NULL);
    CHECK(cb_session_n_past(small) == 0);
    CHECK_OK(cb_chunk_cache_contains(m, after, "new chunk", NULL, &found));
    CHECK(found == 0);
  }

done:
  free(long_context);
  free(l_full);
  free(l_alone);
  free(l_after);
  cb_session_free(small);
  cb_session_free(s);
  cb_chunk_cache_free(alone);
  cb_chunk_cache_free(after);
}

/* The flash store's lookups of one REUSE request of kRagChunks: *hits and
 * *misses grow by what it counted. */
static void reuse_lookups(cb_session* s, cb_chunk_cache* cache, cb_rag_options* ro, uint64_t* hits,
                          uint64_t* misses) {
  cb_chunk_cache_stats before, after;
  cb_rag_stats st;
  collector c;
  cb_chunk_cache_stats_init(&before);
  cb_chunk_cache_stats_init(&after);
  cb_rag_stats_init(&st);
  ro->mode = CB_MODE_REUSE;
  CHECK_OK(cb_chunk_cache_get_stats(cache, &before));
  CHECK_OK(rag_answer(s, cache, ro, &st, &c, NULL, 0));
  CHECK(st.cache_hits == 2 && st.cache_misses == 0);
  CHECK_OK(cb_chunk_cache_get_stats(cache, &after));
  *hits = after.hits - before.hits;
  *misses = after.misses - before.misses;
}

/* Requests look for a chunk's KV computed after a context only through a
 * cache that stored some or was told to (a store an earlier process
 * filled): other caches pay no second lookup per chunk. */
void test_chunk_cache_neighbour_lookup(cb_model* m) {
  cb_model_info info;
  cb_session* s = NULL;
  cb_chunk_cache* cache = NULL;
  cb_rag_options ro;
  char dir[] = "/tmp/cb_c_api_neighbour.XXXXXX";
  char cmd[128];
  uint64_t hits = 0, misses = 0;
  int made_dir;

  s = open_session(m, &info);
  made_dir = mkdtemp(dir) != NULL;
  CHECK(made_dir);
  if (s == NULL || !made_dir) goto done;
  cb_rag_options_init(&ro);
  CHECK_OK(cb_chunk_cache_open(dir, NULL, &cache));
  if (cache == NULL) goto done;
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[0], &ro, NULL, NULL));
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[1], &ro, NULL, NULL));
  /* One lookup per chunk. */
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 0);
  /* Told to look: the second chunk's KV after a context is a miss first. */
  CHECK_OK(cb_chunk_cache_set_neighbour_kv(cache, 1));
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 1);
  CHECK_OK(cb_chunk_cache_set_neighbour_kv(cache, 0));
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 0);
  /* Storing one turns the lookup on; the KV after a context is then found. */
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_chunk_cache_add_after(s, cache, kRagChunks[1], kRagChunks[0], &ro, NULL));
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 0);
  /* Reopened, the cache does not look until told to, and then finds it. */
  CHECK_OK(cb_chunk_cache_flush(cache));
  cb_chunk_cache_free(cache);
  cache = NULL;
  CHECK_OK(cb_chunk_cache_open(dir, NULL, &cache));
  if (cache == NULL) goto done;
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 0);
  CHECK_OK(cb_chunk_cache_set_neighbour_kv(cache, 1));
  reuse_lookups(s, cache, &ro, &hits, &misses);
  CHECK(hits == 2 && misses == 0);

  /* Misuse. */
  CHECK_ERR(cb_chunk_cache_set_neighbour_kv(NULL, 1), CB_ERR_INVALID_ARGUMENT);
  CHECK_ERR(cb_chunk_cache_set_neighbour_kv(cache, 2), CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "0 or 1") != NULL);

done:
  cb_chunk_cache_free(cache);
  cb_session_free(s);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (made_dir) CHECK(system(cmd) == 0);
}

/* A context scale changes what REUSE and BLEND give, not what FULL gives; 1
 * is the default's bit for bit; a bad scale is refused and changes nothing. */
void test_chunk_cache_context_scale(cb_model* m) {
  cb_model_info info;
  cb_session* s = NULL;
  cb_chunk_cache* cache = NULL;
  cb_rag_options ro;
  cb_rag_stats st;
  collector c;
  float *l_default = NULL, *l_one = NULL, *l_scaled = NULL, *l_again = NULL;
  double err = 0.0;
  const float bad[] = {0.0f, -1.0f, 0.005f, 1000.0f, NAN};
  size_t i;

  s = open_session(m, &info);
  CHECK_OK(cb_chunk_cache_create(&cache));
  l_default = logits_row(&info);
  l_one = logits_row(&info);
  l_scaled = logits_row(&info);
  l_again = logits_row(&info);
  if (s == NULL || cache == NULL || l_default == NULL || l_one == NULL || l_scaled == NULL ||
      l_again == NULL)
    goto done;
  cb_rag_options_init(&ro);
  cb_rag_stats_init(&st);
  ro.mode = CB_MODE_REUSE;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_default, info.n_vocab));
  CHECK_OK(cb_chunk_cache_set_context_scale(cache, 1.0f));
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_one, info.n_vocab));
  CHECK(memcmp(l_default, l_one, (size_t)info.n_vocab * sizeof(float)) == 0);
  CHECK_OK(cb_chunk_cache_set_context_scale(cache, 0.6f));
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_scaled, info.n_vocab));
  err = rel_l2(l_scaled, l_default, info.n_vocab);
  printf("context scale 0.6: REUSE against scale 1 rel L2 %.2e\n", err);
  CHECK(err > 1e-3);
  ro.mode = CB_MODE_BLEND;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_again, info.n_vocab));

  /* Misuse: refused with a message; the scale set before stays. */
  CHECK_ERR(cb_chunk_cache_set_context_scale(NULL, 0.5f), CB_ERR_INVALID_ARGUMENT);
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    CHECK_ERR(cb_chunk_cache_set_context_scale(cache, bad[i]), CB_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), "context scale") != NULL);
  }
  ro.mode = CB_MODE_REUSE;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_again, info.n_vocab));
  CHECK(memcmp(l_again, l_scaled, (size_t)info.n_vocab * sizeof(float)) == 0);

  /* FULL does not read the chunks' KV: the scale does not touch it. */
  ro.mode = CB_MODE_FULL;
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_one, info.n_vocab));
  CHECK_OK(cb_chunk_cache_set_context_scale(cache, 1.0f));
  CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_again, info.n_vocab));
  CHECK(memcmp(l_again, l_one, (size_t)info.n_vocab * sizeof(float)) == 0);

done:
  free(l_default);
  free(l_one);
  free(l_scaled);
  free(l_again);
  cb_session_free(s);
  cb_chunk_cache_free(cache);
}
