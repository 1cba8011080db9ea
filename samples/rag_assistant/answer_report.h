// How ask and chat report: an answer's figures and sources, the ranked
// chunks of --retrieve-only, and a question nothing in the store answers.
#pragma once

#include <cacheblend/cacheblend.h>

#include <cstdio>
#include <string>
#include <vector>

#include "answer.h"
#include "corpus_db.h"
#include "retrieval.h"

namespace rag {

// One question's answer and what it took.
struct AnswerResult {
  std::string answer;
  std::vector<ChunkRecord> sources;
  double ttft_ms = 0.0;  // from the start of the RAG prefill to the first token
  double prefill_ms = 0.0;
  cb_rag_stats rag{};
  // Each storage tier's counters for this question (after minus before).
  std::vector<cb_tier_stats> tiers;
  int n_generated = 0;
  bool cancelled = false;
  bool cancelled_in_prefill = false;  // no answer began
};

void print_sources(const std::vector<ChunkRecord>& sources, FILE* out);

// The line after an answer (TTFT, mode, ratio, chunk cache), each tier's
// hits when `tiered`, then the sources.
void print_report(const AnswerResult& r, const AskOptions& o, const char* mode, bool tiered,
                  FILE* out);

// A follow-up's report: it reused the conversation's KV and computed its
// own turn (with the chunks new to the conversation).
void print_follow_up_report(const AnswerResult& r, FILE* out);

// Why nothing was answered, after the "could not find" line.
std::string not_found_detail(const Retrieval& found, const AskOptions& o);

// --retrieve-only: the ranked chunks (or that none is relevant enough),
// no model.  Returns the exit status.
int report_retrieval(const std::string& question, const Retrieval& found, const AskOptions& o);

// ask when no chunk is relevant enough: the "could not find" answer, no
// sources.  Returns kExitNotFound.
int report_not_found(const std::string& question, const Retrieval& found, const AskOptions& o);

// ask --json: the answer with its figures, tiers and sources, one object.
void print_answer_json(const std::string& question, const Retrieval& found, const AnswerResult& r,
                       const AskOptions& o, int threads);

}  // namespace rag
