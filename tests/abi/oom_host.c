/* A host that binds mimalloc's operator new (mimalloc linked ahead of
 * libcacheblend and the C++ runtime, as LD_PRELOAD would): a call that runs
 * out of memory returns CB_ERR_OUT_OF_MEMORY instead of aborting, and the
 * library goes on working.  Then the tokenizer's memory on long text: its
 * tokens and a bounded window, not tables for the whole text.
 *
 *   oom_host MODEL */
#define _POSIX_C_SOURCE 200809L
#include <cacheblend/cacheblend.h>
#include <mimalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The process's virtual memory size. */
static long vm_bytes(void) {
  long pages = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f != NULL) {
    if (fscanf(f, "%ld", &pages) != 1) pages = 0;
    fclose(f);
  }
  return pages * sysconf(_SC_PAGESIZE);
}

int main(int argc, char** argv) {
  const size_t n = (size_t)256 << 20; /* the tokenizer needs several times this */
  const size_t long_text = (size_t)64 << 20;
  static const char kLine[] = "The quick brown fox jumps over the lazy dog.\n";
  cb_model* m = NULL;
  char* text;
  size_t i, n_tokens = 0;
  cb_status s;
  struct rlimit old, cap;
  if (argc != 2) {
    fprintf(stderr, "usage: oom_host MODEL\n");
    return 2;
  }
  printf("mimalloc %d linked first\n", mi_version());
  if (cb_model_load(argv[1], NULL, &m) != CB_OK) {
    fprintf(stderr, "model: %s\n", cb_last_error());
    return 1;
  }
  text = (char*)malloc(n);
  if (text == NULL) return 1;
  for (i = 0; i < n; ++i) text[i] = "hello world. "[i % 13];
  if (getrlimit(RLIMIT_AS, &old) != 0) return 1;
  cap = old;
  cap.rlim_cur = (rlim_t)(vm_bytes() + (64L << 20));
  if (setrlimit(RLIMIT_AS, &cap) != 0) return 1;
  s = cb_tokenize(m, text, n, 0, 0, NULL, 0, &n_tokens);
  if (setrlimit(RLIMIT_AS, &old) != 0) return 1;
  printf("cb_tokenize of %zu MiB under a cap: %s (%s)\n", n >> 20, cb_status_string(s),
         cb_last_error());
  if (s != CB_ERR_OUT_OF_MEMORY || strstr(cb_last_error(), "out of memory") == NULL) return 1;
  s = cb_tokenize(m, text, 100, 0, 0, NULL, 0, &n_tokens);
  printf("then 100 bytes: %s, %zu tokens\n", cb_status_string(s), n_tokens);
  if (s != CB_OK || n_tokens == 0) return 1;

  /* Text of many lines takes memory for its tokens and a bounded window:
   * 64 MiB fits under a cap of 384 MiB (it took ~770 MiB when the whole
   * text went through the pre-tokenizer at once). */
  for (i = 0; i < long_text; ++i) text[i] = kLine[i % (sizeof kLine - 1)];
  cap.rlim_cur = (rlim_t)(vm_bytes() + (384L << 20));
  if (setrlimit(RLIMIT_AS, &cap) != 0) return 1;
  s = cb_tokenize(m, text, long_text, 0, 0, NULL, 0, &n_tokens);
  if (setrlimit(RLIMIT_AS, &old) != 0) return 1;
  printf("cb_tokenize of %zu MiB of lines under a cap: %s (%s), %zu tokens\n", long_text >> 20,
         cb_status_string(s), cb_last_error(), n_tokens);
  free(text);
  cb_model_free(m);
  return s == CB_OK && n_tokens > long_text / 8 ? 0 : 1;
}
