/* The C API: the progress callback's stages and counts in every call that
 * reports, removing it, and freeing the session from it. */
#include <stdio.h>
#include <string.h>

#include "c_api_test.h"

/* Every report of a call, in order. */
typedef struct {
  int n;
  cb_progress_stage stage[512];
  int32_t done[512];
  int32_t total[512];
  int stop_at;                /* stops at report `stop_at` (0: never) */
  cb_session* free_at_report; /* freed at report `free_at` (0: never) */
  int free_at;
} progress_log;

static int record_progress(cb_progress_stage stage, int32_t done, int32_t total, void* user) {
  progress_log* p = (progress_log*)user;
  if (p->n < 512) {
    p->stage[p->n] = stage;
    p->done[p->n] = done;
    p->total[p->n] = total;
  }
  ++p->n;
  if (p->free_at > 0 && p->n == p->free_at) cb_session_free(p->free_at_report);
  return p->stop_at > 0 && p->n == p->stop_at;
}

/* Whether reports [*at, ...) hold one run of `stage` counting `step` at a
 * time (the last step shorter) up to `total`; moves *at past it. */
static int run_of(const progress_log* p, int* at, cb_progress_stage stage, int32_t step,
                  int32_t total) {
  int32_t expect = 0;
  while (expect < total) {
    expect = expect + step < total ? expect + step : total;
    if (*at >= p->n || *at >= 512 || p->stage[*at] != stage || p->done[*at] != expect ||
        p->total[*at] != total) {
      fprintf(stderr, "progress report %d: stage %d, %d of %d; expected stage %d, %d of %d\n", *at,
              *at < p->n ? (int)p->stage[*at] : -1, *at < p->n ? (int)p->done[*at] : -1,
              *at < p->n ? (int)p->total[*at] : -1, (int)stage, (int)expect, (int)total);
      return 0;
    }
    ++*at;
  }
  return 1;
}

void test_progress_callback(cb_model* m) {
  cb_session_options so;
  cb_session* s = NULL;
  cb_chunk_cache* cache = NULL;
  cb_model_info info;
  cb_rag_options ro;
  cb_rag_stats st;
  cb_generate_options go;
  progress_log p;
  int32_t ids[400];
  size_t n = 0;
  int at = 0;
  char text[4096];
  float emb[4096];
  cb_model_info_init(&info);
  CHECK_OK(cb_model_get_info(m, &info));
  n = lighthouse_text(m, 16, text, ids);
  CHECK(n > 150);
  cb_session_options_init(&so);
  so.n_ctx = 512;
  so.n_batch = 64;
  CHECK_OK(cb_session_create(m, &so, &s));
  CHECK_OK(cb_chunk_cache_create(&cache));
  if (s == NULL || cache == NULL) goto done;
  CHECK_ERR(cb_session_set_progress_callback(NULL, record_progress, &p), CB_ERR_INVALID_ARGUMENT);
  memset(&p, 0, sizeof p);
  CHECK_OK(cb_session_set_progress_callback(s, record_progress, &p));

  /* A prefill: a report per batch of 64 tokens, counting the call's tokens. */
  CHECK_OK(cb_session_prefill(s, ids, n));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_PREFILL, 64, (int32_t)n) && at == p.n);

  /* An embedding, and the prompt of a generation (not its tokens). */
  memset(&p, 0, sizeof p);
  CHECK_OK(cb_session_embed(s, ids, 100, emb, sizeof emb / sizeof emb[0]));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_PREFILL, 64, 100) && at == p.n);
  memset(&p, 0, sizeof p);
  cb_generate_options_init(&go);
  go.max_tokens = 4;
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_generate(s, ids, 70, &go, NULL, NULL, NULL));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_PREFILL, 64, 70) && at == p.n);

  /* Adding a chunk to the cache: its KV, layer by layer. */
  memset(&p, 0, sizeof p);
  cb_rag_options_init(&ro);
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_chunk_cache_add(s, cache, kRagChunks[0], &ro, NULL, NULL));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_CHUNK, 1, info.n_layer) && at == p.n);

  /* A blend: the chunk the cache lacks is computed first, then the passes
   * over the request (the default selection's ranking pass, then the blend
   * pass: one run of 2 x n_layer); once both are cached, the passes alone,
   * and one pass with a selection that ranks within it. */
  memset(&p, 0, sizeof p);
  CHECK_OK(cb_session_reset(s));
  cb_rag_stats_init(&st);
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, &st));
  CHECK(st.cache_hits == 1 && st.cache_misses == 1);
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_CHUNK, 1, info.n_layer));
  CHECK(run_of(&p, &at, CB_PROGRESS_BLEND, 1, 2 * info.n_layer) && at == p.n);
  memset(&p, 0, sizeof p);
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, &st));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_BLEND, 1, 2 * info.n_layer) && at == p.n);
  memset(&p, 0, sizeof p);
  ro.select = CB_SELECT_HKVD;
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, &st));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_BLEND, 1, info.n_layer) && at == p.n);
  ro.select = CB_SELECT_DEFAULT;

  /* Full prefill of the request: its tokens. */
  memset(&p, 0, sizeof p);
  ro.mode = CB_MODE_FULL;
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_rag_prefill(s, NULL, kRagChunks, 2, kRagQuestion, &ro, &st));
  at = 0;
  CHECK(run_of(&p, &at, CB_PROGRESS_PREFILL, 64, st.n_tokens) && at == p.n);

  /* Stopped at the third batch of a prefill, and at the third layer of a
   * blend's pass: the session is left as the abort callback leaves it. */
  memset(&p, 0, sizeof p);
  p.stop_at = 3;
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_session_prefill(s, ids, 10));
  CHECK_ERR(cb_session_prefill(s, ids + 10, n - 10), CB_ERR_CANCELLED);
  CHECK(p.n == 3 && cb_session_n_past(s) == 10);
  CHECK(strstr(cb_last_error(), "progress callback") != NULL);
  memset(&p, 0, sizeof p);
  p.stop_at = 3;
  ro.mode = CB_MODE_BLEND;
  CHECK_OK(cb_session_reset(s));
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, &st), CB_ERR_CANCELLED);
  CHECK(p.n == 3 && p.stage[2] == CB_PROGRESS_BLEND && cb_session_n_past(s) == 0);

  /* Removed: no more reports. */
  memset(&p, 0, sizeof p);
  CHECK_OK(cb_session_set_progress_callback(s, NULL, NULL));
  CHECK_OK(cb_session_reset(s));
  CHECK_OK(cb_session_prefill(s, ids, n));
  CHECK(p.n == 0);

  /* Freed from the callback at the second batch: the prefill stops there
   * with CB_ERR_CANCELLED and the session is gone when it returns. */
  memset(&p, 0, sizeof p);
  p.free_at_report = s;
  p.free_at = 2;
  CHECK_OK(cb_session_set_progress_callback(s, record_progress, &p));
  CHECK_OK(cb_session_reset(s));
  CHECK_ERR(cb_session_prefill(s, ids, n), CB_ERR_CANCELLED);
  CHECK(p.n == 2);
  CHECK(strstr(cb_last_error(), "freed the session") != NULL);
  CHECK(cb_session_n_ctx(s) == 0); /* not live */
  s = NULL;
done:
  cb_chunk_cache_free(cache);
  cb_session_free(s);
}
