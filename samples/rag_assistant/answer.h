// `rag_assistant ask` and `chat`: retrieve, fuse the chunks' KV, answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app.h"
#include "retrieval.h"

namespace rag {

struct AskOptions {
  int top_k = 3;
  cb_mode mode = CB_MODE_BLEND;
  float ratio = -1.0f;  // < 0: the library's default (cb_rag_options_init)
  cb_select select = CB_SELECT_DEFAULT;
  bool auto_ratio = false;  // --ratio auto: the loading controller picks r
  int chunk_shift = -1;     // 0 or 1; < 0: the library's default (cb_rag_options_init)
  int max_tokens = 160;     // answer length cap
  // Generation: greedy unless temperature > 0 (then min_p cuts, seeded);
  // repeat_penalty 1: none; the answer ends before the first stop string.
  // The repeat penalty's default, 1.2 over the library's window of 64
  // tokens, is measured on the default model (scripts/rag_repeat_penalty.py,
  // README): without it some longer answers repeat themselves, and short
  // factual answers are the same either way.
  float temperature = 0.0f;
  float min_p = 0.0f;
  float repeat_penalty = 1.2f;
  int repeat_last_n = -1;  // the window repeat_penalty looks at; < 0: the library's (64)
  uint64_t seed = 0;
  std::vector<std::string> stops;
  // The best chunk goes last, next to the question (--context-order
  // best-last, the default) or first (best-first).  Small models lean on
  // the text nearest the question: with the default 135M model, best-last
  // turned most wrong answers on the demo corpus into right ones.
  bool best_last = true;
  bool json = false;
  // Retrieval (retrieval.h): the relevance floor (0: off), the per-file
  // cap and near-repeat skip (off: plain BM25 order), and --retrieve-only
  // (rank and report the chunks, load no model, answer nothing).
  double min_relevance = kDefaultMinRelevance;
  bool diversity = true;
  bool retrieve_only = false;
};

// The exit status of an ask whose question nothing in the store is
// relevant to ("I could not find this in your documents.").
constexpr int kExitNotFound = 3;
constexpr const char kNotFoundAnswer[] = "I could not find this in your documents.";

// One question, answered and reported (streamed unless --json).  Returns the
// exit status: 0, or kExitNotFound when no chunk reaches the relevance
// floor (then no model runs); an Error for no store or an empty store.
int run_ask(const CommonOptions& common, const AskOptions& opts, const std::string& question);

// Questions from stdin, one per line, until EOF or Ctrl-C at the prompt;
// Ctrl-C during an answer stops that answer only.
int run_chat(const CommonOptions& common, const AskOptions& opts);

}  // namespace rag
