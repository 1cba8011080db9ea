// Which chunks answer a question: BM25 candidates from the store, a
// relevance floor that says when nothing in the store is about the
// question, and a per-file cap so that one long file cannot take every
// slot.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "corpus_db.h"

namespace rag {

// Below this relevance nothing is an answer (--min-relevance).  Chosen by
// measurement on labelled questions (samples/rag_assistant/README.md,
// "Retrieval"): it refuses most questions whose answer is in no file while
// keeping nearly every answerable one.
constexpr double kDefaultMinRelevance = 0.5;

struct RetrievalOptions {
  int top_k = 3;
  // 0 disables the floor: any chunk that shares a word with the question
  // is an answer.
  double min_relevance = kDefaultMinRelevance;
  // At most this many chunks of one file while chunks of other files
  // remain; <= 0: half the slots, rounded up.
  int max_per_file = 0;
  // false: the top_k candidates in BM25 order, uncapped.
  bool diverse = true;
  // The question's relevance: true, the share of its terms that the picked
  // chunks hold together (a question that needs two documents is answered
  // by two); false, that of the best picked chunk alone.
  bool union_relevance = true;
  // BM25 candidates fetched per slot, for the cap and the relevance to
  // choose from.
  int candidates_per_slot = 4;
};

struct Retrieval {
  std::vector<ChunkRecord> chunks;  // best first; empty when !found
  // The picked chunks' relevance (see union_relevance); 0 without
  // candidates.
  double relevance = 0.0;
  bool found = false;
};

// The relevance of chunks to a question: the share of the question's
// content terms (stopwords dropped, words with one porter stem counted
// once) that the chunks hold, each weighted by its rarity in the store,
// idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5)) for N chunks of which
// n(t) hold t.  It does not grow with the corpus or the question's length,
// a term in no chunk weighs most, and one in every chunk next to nothing,
// so chunks that share only common words with the question score low.  A
// question of stopwords only has no content terms: relevance 0.
//
// retrieve() fetches the BM25 best max(20, top_k * candidates_per_slot)
// chunks and scores each (ChunkRecord::relevance).  Then it picks top_k in
// BM25 order, skipping a chunk whose file already has max_per_file picked
// (when a later candidate of another file is at least as relevant, or
// holds more of what the picked chunks leave uncovered) or whose
// text nearly repeats a picked one; skipped chunks fill the slots
// left when no other candidate remains (diverse == false: the first
// top_k).  The question is answered (found) when the picked chunks'
// relevance (Retrieval::relevance) reaches min_relevance.
Retrieval retrieve(CorpusDb& db, const std::string& question, const RetrievalOptions& opts);

// The chunk of the store most like `chunk` by BM25 with the chunk's own
// words as the query: the text that a question retrieving `chunk` most
// likely retrieves beside it (the neighbour its KV is computed after with
// --kv-neighbours).  Never `chunk` itself or a chunk of the same text;
// nullopt when no other chunk shares a word with it.
std::optional<ChunkRecord> nearest_chunk(CorpusDb& db, const ChunkRecord& chunk);

// The pick alone, on candidates in BM25 order (exposed for tests).
// gain(picked, c): the weight of the question's terms that c holds and no
// picked chunk does (retrieve() passes it; without it only relevance
// counts).
using CoverageGain =
    std::function<double(const std::vector<ChunkRecord>& picked, const ChunkRecord& c)>;
std::vector<ChunkRecord> pick_diverse(const std::vector<ChunkRecord>& candidates, int top_k,
                                      int max_per_file, const CoverageGain& gain = {});

}  // namespace rag
