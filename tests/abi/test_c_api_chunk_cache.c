/* The C API: chunks added ahead of time with cb_chunk_cache_add (in RAM
 * and on flash, the parts of the key, misuse), and chunk caches on degraded
 * storage. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "c_api_test.h"

/* Precomputing chunks from text (an ingest step): what cb_chunk_cache_add
 * stores is what cb_rag_prefill finds with the same options, in RAM and on
 * flash; other options (namespace, system prompt, chunk head) do not see it. */
void test_chunk_cache_add(cb_model* m) {
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
  n = 9;
  CHECK_OK(cb_chunk_cache_n_tiers(cache, &n));
  CHECK(n == 0); /* a cache in RAM has no storage tiers */

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

/* Degraded storage opens with a report instead of failing: a slow_dir that
 * is not a directory is skipped and counted; on a full disk (a file size
 * limit of 0: no file can grow, so SQLite cannot make the -shm it needs to
 * read) the store opens read-only. */
void test_chunk_cache_degraded_storage(void) {
  char dir[] = "/tmp/cb_c_api_degraded.XXXXXX";
  char slow[128], cmd[160], report[2048];
  FILE* f;
  cb_store_options so;
  cb_chunk_cache* cache = NULL;
  cb_chunk_cache_stats cs;
  size_t n = 0;
  cb_status opened;
  struct rlimit saved, none;
  void (*old_handler)(int);

  if (mkdtemp(dir) == NULL) {
    CHECK(0);
    return;
  }
  snprintf(slow, sizeof slow, "%s/sdcard", dir);
  f = fopen(slow, "w");
  CHECK(f != NULL);
  if (f != NULL) fclose(f);
  cb_store_options_init(&so);
  so.slow_dir = slow;
  CHECK_OK(cb_chunk_cache_open(dir, &so, &cache));
  if (cache != NULL) {
    CHECK_OK(cb_chunk_cache_n_tiers(cache, &n));
    CHECK(n == 1); /* flash alone */
    cb_chunk_cache_stats_init(&cs);
    CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
    CHECK(cs.unavailable_tiers == 1 && cs.read_only == 0 && cs.quarantined == 0);
    CHECK_OK(cb_chunk_cache_open_report(cache, NULL, 0, &n));
    CHECK(n > 0 && n < sizeof report);
    CHECK_OK(cb_chunk_cache_open_report(cache, report, sizeof report, &n));
    CHECK(strstr(report, slow) != NULL && strstr(report, "unavailable") != NULL);
    CHECK_ERR(cb_chunk_cache_open_report(cache, report, 2, &n), CB_ERR_BUFFER_TOO_SMALL);
    CHECK_ERR(cb_chunk_cache_open_report(cache, report, sizeof report, NULL),
              CB_ERR_INVALID_ARGUMENT);
    /* A struct from before the degraded-storage counters. */
    cb_chunk_cache_stats_init(&cs);
    cs.struct_size = offsetof(cb_chunk_cache_stats, quarantined);
    CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
    cb_chunk_cache_free(cache);
  }

  so.slow_dir = NULL;
  getrlimit(RLIMIT_FSIZE, &saved);
  none = saved;
  none.rlim_cur = 0;
  old_handler = signal(SIGXFSZ, SIG_IGN);
  setrlimit(RLIMIT_FSIZE, &none);
  cache = NULL;
  opened = cb_chunk_cache_open(dir, &so, &cache);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  CHECK_OK(opened);
  if (cache != NULL) {
    cb_chunk_cache_stats_init(&cs);
    CHECK_OK(cb_chunk_cache_get_stats(cache, &cs));
    CHECK(cs.read_only == 1 && cs.unavailable_tiers == 0);
    CHECK_OK(cb_chunk_cache_open_report(cache, report, sizeof report, &n));
    CHECK(strstr(report, "opened read-only") != NULL);
    cb_chunk_cache_free(cache);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}
