/* What the C API test's files share: the check macros and their counters,
 * the token collector, helpers used by more than one file, and the tests
 * that main() (test_c_api.c) runs. */
#ifndef CB_TEST_C_API_H
#define CB_TEST_C_API_H

#include <cacheblend/cacheblend.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef CB_DEFAULT_MODEL
#define CB_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

extern int g_passed;
extern int g_failed;

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

int collect(int32_t token, const char* piece, size_t piece_len, void* user);

/* The backend a model computes on ("cpu" or "cuda"). */
const char* backend_of(cb_model* m);
/* A ChatML user turn asking `question`, tokenized into ids; its length. */
size_t chat_prompt(cb_model* m, const char* question, int32_t* ids, size_t cap);

/* `copies` (at most 16) times a sentence of plain English into text (4096
 * bytes), and its tokens, BOS first, into ids (400); the number of tokens. */
size_t lighthouse_text(cb_model* m, int copies, char* text, int32_t* ids);

/* Two chunks and a question whose answer is in the second chunk. */
extern const char* const kRagChunks[2];
extern const char* const kRagQuestion;
/* A RAG prefill of kRagChunks and kRagQuestion, then a greedy answer into
 * `out`; the prefill's logits into `logits` when not NULL. */
cb_status rag_answer(cb_session* s, cb_chunk_cache* cache, const cb_rag_options* ro,
                     cb_rag_stats* st, collector* out, float* logits, int32_t n_vocab);
int32_t argmax(const float* v, int32_t n);
double rel_l2(const float* a, const float* b, int32_t n);

/* test_c_api.c */
void test_version_and_status(void);
void test_error_messages_are_escaped(void);
void test_load_errors(const char* path);
void test_model_info(cb_model* m);
void test_tokens(cb_model* m);
void test_chat_format_errors(cb_model* m);
void test_chat_templates(cb_model* m, const char* path);
void test_init_sizes(const char* path);
/* test_c_api_generate.c */
void test_generate(cb_model* m);
void test_generation_controls(cb_model* m);
void test_context_limits(cb_model* m);
void test_kv_types(cb_model* m);
void test_embed(cb_model* m);
void test_lifetime(const char* path);
void test_threads(cb_model* m);
void test_concurrent_use_of_one_session(cb_model* m);
void test_thread_exit_in_callback(cb_model* m);
/* test_c_api_rag.c */
void test_abort_callback(cb_model* m);
void test_free_from_abort_callback(cb_model* m);
void test_nan_logits(const char* path);
void test_rag_store(cb_model* m);
void test_rag_tiers(cb_model* m);
/* test_c_api_progress.c */
void test_progress_callback(cb_model* m);
/* test_c_api_chunk_cache.c */
void test_chunk_cache_add(cb_model* m);
void test_chunk_cache_degraded_storage(void);
/* test_c_api_experimental.c */
void test_chunk_cache_add_after(cb_model* m);
void test_chunk_cache_neighbour_lookup(cb_model* m);
void test_chunk_cache_context_scale(cb_model* m);
/* test_c_api_handles.c */
void test_handles(cb_model* m, const char* path);
void test_rag(cb_model* m);

#endif
