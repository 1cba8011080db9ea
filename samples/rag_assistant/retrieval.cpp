#include "retrieval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

namespace rag {
namespace {

// Chunks whose word sets overlap this much (Jaccard) say the same thing:
// one of them is enough (a changelog repeats its entries, a license its
// paragraphs).
constexpr double kNearDuplicate = 0.8;

std::set<std::string> word_set(std::string_view text) {
  std::set<std::string> out;
  std::string w;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c >= 0x80) {
      w += static_cast<char>(std::tolower(c));
    } else if (!w.empty()) {
      out.insert(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.insert(std::move(w));
  return out;
}

double jaccard(const std::set<std::string>& a, const std::set<std::string>& b) {
  if (a.empty() && b.empty()) return 1.0;
  size_t common = 0;
  for (const std::string& w : a) common += b.count(w);
  return static_cast<double>(common) / static_cast<double>(a.size() + b.size() - common);
}

// BM25's idf, never negative: a term in every chunk weighs about 0, one in
// no chunk ln(2N + 2).
double idf(int64_t n_chunks, int64_t with_term) {
  const double n = static_cast<double>(n_chunks), df = static_cast<double>(with_term);
  return std::log(1.0 + (n - df + 0.5) / (df + 0.5));
}

}  // namespace

std::vector<ChunkRecord> pick_diverse(const std::vector<ChunkRecord>& candidates, int top_k,
                                      int max_per_file, const CoverageGain& gain) {
  if (max_per_file <= 0) max_per_file = (top_k + 1) / 2;
  const size_t k = static_cast<size_t>(std::max(top_k, 0));
  std::vector<ChunkRecord> picked;
  std::vector<std::set<std::string>> picked_words;
  std::map<int64_t, int> per_file;
  std::vector<size_t> over_cap, repeats;  // skipped, in BM25 order
  // The cap gives a slot to another file only when one of its chunks holds
  // as much of the question (relevance) as the capped chunk, or more of
  // what the picked chunks leave uncovered: a file's third chunk that
  // answers what no other file does (a README's build section after two of
  // its other sections) is not traded for a weaker match, while a question
  // about two things gets both.
  auto another_file_as_relevant = [&](size_t i) {
    const double own_gain = gain ? gain(picked, candidates[i]) : 0.0;
    for (size_t j = i + 1; j < candidates.size(); ++j)
      if (candidates[j].file_id != candidates[i].file_id &&
          per_file[candidates[j].file_id] < max_per_file &&
          (candidates[j].relevance >= candidates[i].relevance ||
           (gain && gain(picked, candidates[j]) > own_gain)))
        return true;
    return false;
  };
  for (size_t i = 0; i < candidates.size() && picked.size() < k; ++i) {
    const ChunkRecord& c = candidates[i];
    std::set<std::string> words = word_set(c.text);
    const bool repeat = std::any_of(picked_words.begin(), picked_words.end(), [&](const auto& p) {
      return jaccard(words, p) >= kNearDuplicate;
    });
    if (repeat) {
      repeats.push_back(i);
    } else if (per_file[c.file_id] >= max_per_file && another_file_as_relevant(i)) {
      over_cap.push_back(i);
    } else {
      ++per_file[c.file_id];
      picked.push_back(c);
      picked_words.push_back(std::move(words));
    }
  }
  // Fewer other candidates than slots: the skipped ones are still better
  // than an empty slot, a file's own next chunk before a repeat.
  for (const std::vector<size_t>* rest : {&over_cap, &repeats})
    for (size_t i : *rest)
      if (picked.size() < k) picked.push_back(candidates[i]);
  // The fill-in came after better picks in the loop: back to BM25 order.
  std::stable_sort(picked.begin(), picked.end(),
                   [](const ChunkRecord& a, const ChunkRecord& b) { return a.score < b.score; });
  return picked;
}

Retrieval retrieve(CorpusDb& db, const std::string& question, const RetrievalOptions& opts) {
  Retrieval r;
  const int n_candidates = std::max(opts.top_k * std::max(opts.candidates_per_slot, 1), 20);
  std::vector<ChunkRecord> candidates = db.search(fts_match_query(question), n_candidates);
  if (candidates.empty()) return r;

  // The question's content terms, one word for each porter stem.
  const std::vector<std::string> words = content_words(question);
  const std::vector<std::string> terms = db.index_terms(words);
  std::vector<std::string> term_words;
  std::set<std::string> seen;
  for (size_t i = 0; i < words.size(); ++i)
    if (!terms[i].empty() && seen.insert(terms[i]).second) term_words.push_back(words[i]);

  std::vector<int64_t> ids;
  for (const ChunkRecord& c : candidates) ids.push_back(c.id);
  std::vector<double> weights;
  std::map<int64_t, std::vector<size_t>> held;  // chunk id: the terms it holds
  double total = 0.0;
  const int64_t n_chunks = db.n_chunks();
  for (const std::string& w : term_words) {
    weights.push_back(idf(n_chunks, db.chunks_with_word(w)));
    total += weights.back();
    for (int64_t id : db.chunks_with_word_among(w, ids)) held[id].push_back(weights.size() - 1);
  }
  // The weighted share of the terms that any of `chunks` holds.
  auto coverage = [&](const std::vector<ChunkRecord>& chunks) {
    if (total <= 0.0) return 0.0;
    std::set<size_t> covered;
    for (const ChunkRecord& c : chunks)
      for (size_t t : held[c.id]) covered.insert(t);
    double sum = 0.0;
    for (size_t t : covered) sum += weights[t];
    return sum / total;
  };
  for (ChunkRecord& c : candidates) c.relevance = coverage({c});

  if (opts.diverse) {
    // The weight of the terms a chunk holds that no picked chunk does.
    const CoverageGain gain = [&](const std::vector<ChunkRecord>& picked, const ChunkRecord& c) {
      std::set<size_t> covered;
      for (const ChunkRecord& p : picked)
        for (size_t t : held[p.id]) covered.insert(t);
      double sum = 0.0;
      for (size_t t : held[c.id])
        if (!covered.count(t)) sum += weights[t];
      return sum;
    };
    r.chunks = pick_diverse(candidates, opts.top_k, opts.max_per_file, gain);
  } else {
    candidates.resize(std::min(candidates.size(), static_cast<size_t>(std::max(opts.top_k, 0))));
    r.chunks = std::move(candidates);
  }
  if (opts.union_relevance) {
    r.relevance = coverage(r.chunks);
  } else {
    for (const ChunkRecord& c : r.chunks) r.relevance = std::max(r.relevance, c.relevance);
  }
  r.found = opts.min_relevance <= 0.0 || r.relevance >= opts.min_relevance;
  if (!r.found) r.chunks.clear();
  return r;
}

std::optional<ChunkRecord> nearest_chunk(CorpusDb& db, const ChunkRecord& chunk) {
  // The chunk itself ranks first, and copies of it (the same text in
  // another file) next: a few more candidates leave room for them.
  for (ChunkRecord& c : db.search(fts_match_query(chunk.text), 4))
    if (c.id != chunk.id && c.text != chunk.text) return std::move(c);
  return std::nullopt;
}

}  // namespace rag
