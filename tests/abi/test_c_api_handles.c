/* The C API: handles used after free, freed twice or of the wrong type, and
 * retrieval-augmented prefills in every mode. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_test.h"

#include <cacheblend/cacheblend_experimental.h>

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
void test_handles(cb_model* m, const char* path) {
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

void test_rag(cb_model* m) {
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
        strcmp(cb_select_name(CB_SELECT_ORACLE_KL), "oracle_kl") == 0 &&
        strcmp(cb_select_name((cb_select)99), "unknown") == 0);
  CHECK(ro.sink_tokens == 0 && ro.guard_share == 0.0f && ro.guard_max_ratio == 0.5f);
  CHECK(ro.chunk_shift == 1 && ro.shift_probes == 0.25f && ro.shift_span == 128);
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
  /* Two threads reading the cached chunks: the same logits (bit for bit
   * on the CPU; a GPU's libraries need not repeat their rounding). */
  {
    float* l_two = (float*)malloc((size_t)info.n_vocab * sizeof(float));
    CHECK(l_two != NULL);
    if (l_two != NULL) {
      ro.fetch_threads = 2;
      cb_rag_stats_init(&st);
      CHECK_OK(rag_answer(s, cache, &ro, &st, &c, l_two, info.n_vocab));
      CHECK(st.cache_hits == 2 && st.pipelined == 1);
      if (strcmp(backend_of(m), "cpu") == 0) {
        CHECK(memcmp(l_two, l_mode, (size_t)info.n_vocab * sizeof(float)) == 0);
      } else {
        CHECK(rel_l2(l_two, l_mode, info.n_vocab) < 1e-5);
      }
      ro.fetch_threads = 0;
      free(l_two);
    }
  }

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
  cb_rag_options_init(&ro);
  ro.chunk_shift = 2;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "chunk_shift") != NULL);
  cb_rag_options_init(&ro);
  ro.shift_probes = -0.1f;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "shift_probes") != NULL);
  ro.shift_probes = (float)NAN;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  cb_rag_options_init(&ro);
  ro.shift_span = -1;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "shift_span") != NULL);
  cb_rag_options_init(&ro);
  CHECK(ro.fetch_threads == 0);
  ro.fetch_threads = -1;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "fetch_threads") != NULL);
  ro.fetch_threads = 65;
  CHECK_ERR(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL),
            CB_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cb_last_error(), "fetch_threads") != NULL);
  CHECK(cb_session_n_past(s) == 0);
  /* A caller built against the struct before `select` still works, with
   * the defaults for the fields it lacks. */
  cb_rag_options_init(&ro);
  ro.struct_size = offsetof(cb_rag_options, select);
  CHECK_OK(cb_rag_prefill(s, cache, kRagChunks, 2, kRagQuestion, &ro, NULL));
  CHECK_OK(cb_session_reset(s));
  /* ... and one built before `fetch_threads`: what lies past its struct is
   * not read. */
  cb_rag_options_init(&ro);
  ro.struct_size = offsetof(cb_rag_options, fetch_threads);
  ro.fetch_threads = -1;
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
