#include "answer_report.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "json_writer.h"
#include "printable.h"

namespace rag {
namespace {

std::string ratio_text(const AnswerResult& r, const AskOptions& o) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f%s", static_cast<double>(r.rag.ratio),
                o.auto_ratio && o.mode == CB_MODE_BLEND ? " (auto)" : "");
  return buf;
}

// A source as --json reports it.
cbs::JsonObject source_json(const ChunkRecord& c) {
  cbs::JsonObject s;
  s.add("id", c.id)
      .add("file", c.display)
      .add("chunk", static_cast<int64_t>(c.index))
      .add("title", c.title)
      .add("bm25", c.score)
      .add("relevance", std::round(c.relevance * 1e4) / 1e4);
  return s;
}

}  // namespace

void print_sources(const std::vector<ChunkRecord>& sources, FILE* out) {
  std::fprintf(out, "sources:");
  for (size_t i = 0; i < sources.size(); ++i)
    std::fprintf(out, "%s [%zu] %s #%d", i ? "," : "", i + 1,
                 cbs::printable(sources[i].display).c_str(), sources[i].index);
  std::fprintf(out, "\n");
  std::fflush(out);
}

void print_report(const AnswerResult& r, const AskOptions& o, const char* mode, bool tiered,
                  FILE* out) {
  std::fprintf(out,
               "\n---\nTTFT %.1f ms (RAG prefill %.1f ms) | mode %s, r = %s | chunk cache: "
               "%d hit(s), %d miss(es) | %d context tokens, %d answer tokens%s\n",
               r.ttft_ms, r.prefill_ms, mode, ratio_text(r, o).c_str(), r.rag.cache_hits,
               r.rag.cache_misses, r.rag.n_tokens, r.n_generated,
               r.cancelled ? " (cancelled)" : "");
  if (tiered) {
    std::fprintf(out, "storage tiers (hits):");
    for (size_t i = 0; i < r.tiers.size(); ++i)
      std::fprintf(out, "%s %s %llu", i ? "," : "", r.tiers[i].name,
                   static_cast<unsigned long long>(r.tiers[i].hits));
    std::fprintf(out, "\n");
  }
  print_sources(r.sources, out);
}

void print_follow_up_report(const AnswerResult& r, FILE* out) {
  std::fprintf(out,
               "\n---\nTTFT %.1f ms | follow-up: %d earlier token(s) reused, %d computed "
               "(%d new chunk(s)) | %d answer tokens%s\n",
               r.ttft_ms, r.rag.n_reused, r.rag.n_tokens - r.rag.n_reused, r.rag.cache_misses,
               r.n_generated, r.cancelled ? " (cancelled)" : "");
  print_sources(r.sources, out);
}

std::string not_found_detail(const Retrieval& found, const AskOptions& o) {
  char buf[160];
  if (found.relevance <= 0.0 && o.min_relevance <= 0.0)
    std::snprintf(buf, sizeof buf, "no document shares a word with the question");
  else
    std::snprintf(buf, sizeof buf,
                  "the retrieved chunks' relevance %.2f is below --min-relevance %.2f: no sources",
                  found.relevance, o.min_relevance);
  return buf;
}

int report_retrieval(const std::string& question, const Retrieval& found, const AskOptions& o) {
  if (o.json) {
    std::vector<cbs::JsonObject> src;
    for (const ChunkRecord& c : found.chunks) {
      cbs::JsonObject s = source_json(c);
      s.add("text", c.text);
      src.push_back(std::move(s));
    }
    cbs::JsonObject j;
    j.add("question", question)
        .add("found", found.found)
        .add("relevance", std::round(found.relevance * 1e4) / 1e4)
        .add("min_relevance", o.min_relevance)
        .add("diversity", o.diversity)
        .add("sources", src);
    std::printf("%s\n", j.str().c_str());
  } else if (!found.found) {
    std::printf("%s\n(%s)\n", kNotFoundAnswer, not_found_detail(found, o).c_str());
  } else {
    for (size_t i = 0; i < found.chunks.size(); ++i) {
      const ChunkRecord& c = found.chunks[i];
      // The chunk's first words, on one line.
      std::string head = c.text.substr(0, 100);
      for (char& ch : head)
        if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
      std::printf("[%zu] %s #%d  bm25 %.3f  relevance %.2f\n    %s%s\n", i + 1,
                  cbs::printable(c.display).c_str(), c.index, c.score, c.relevance,
                  cbs::printable(head).c_str(), c.text.size() > head.size() ? " ..." : "");
    }
    std::printf("relevance of these chunks together: %.2f (--min-relevance %.2f)\n",
                found.relevance, o.min_relevance);
  }
  std::fflush(stdout);
  return found.found ? 0 : kExitNotFound;
}

int report_not_found(const std::string& question, const Retrieval& found, const AskOptions& o) {
  if (o.json) {
    cbs::JsonObject j;
    j.add("question", question)
        .add("answer", kNotFoundAnswer)
        .add("found", false)
        .add("relevance", std::round(found.relevance * 1e4) / 1e4)
        .add("min_relevance", o.min_relevance)
        .add("sources", std::vector<cbs::JsonObject>{});
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s\n\n---\n%s\n", kNotFoundAnswer, not_found_detail(found, o).c_str());
  }
  std::fflush(stdout);
  return kExitNotFound;
}

void print_answer_json(const std::string& question, const Retrieval& found, const AnswerResult& r,
                       const AskOptions& o, int threads) {
  std::vector<cbs::JsonObject> src;
  for (const ChunkRecord& c : r.sources) src.push_back(source_json(c));
  std::vector<cbs::JsonObject> tiers;
  for (const cb_tier_stats& t : r.tiers) {
    cbs::JsonObject j;
    j.add("name", t.name)
        .add("hits", static_cast<int64_t>(t.hits))
        .add("misses", static_cast<int64_t>(t.misses))
        .add("bytes_read", static_cast<int64_t>(t.bytes_read))
        .add("read_failures", static_cast<int64_t>(t.read_failures))
        .add("placed", static_cast<int64_t>(t.placed))
        .add("promoted_in", static_cast<int64_t>(t.promoted_in))
        .add("failures", static_cast<int64_t>(t.failures));
    tiers.push_back(std::move(j));
  }
  cbs::JsonObject j;
  j.add("question", question)
      .add("answer", r.answer)
      .add("found", true)
      .add("relevance", std::round(found.relevance * 1e4) / 1e4)
      .add("ttft_ms", r.ttft_ms)
      .add("prefill_ms", r.prefill_ms)
      .add("ratio", std::round(static_cast<double>(r.rag.ratio) * 1e6) / 1e6)
      .add("ratio_mode", o.auto_ratio ? "auto" : "fixed")
      .add("select", o.mode == CB_MODE_BLEND ? cb_select_name(o.select) : "none")
      .add("context_order", o.best_last ? "best-last" : "best-first")
      .add("mode", cb_mode_name(o.mode))
      .add("sources", src)
      .add("cache_hits", r.rag.cache_hits)
      .add("cache_misses", r.rag.cache_misses)
      .add("chunks_recomputed", r.rag.chunks_recomputed)
      .add("tiers", tiers)
      .add("n_ctx", r.rag.n_tokens)
      .add("n_reused", r.rag.n_reused)
      .add("computed_fraction", r.rag.computed_fraction)
      .add("n_generated", static_cast<int64_t>(r.n_generated))
      .add("threads", static_cast<int64_t>(threads));
  if (o.mode == CB_MODE_BLEND) {
    cb_rag_options defaults;
    cb_rag_options_init(&defaults);
    j.add("chunk_shift", (o.chunk_shift < 0 ? defaults.chunk_shift : o.chunk_shift) != 0);
  } else {
    j.add_null("chunk_shift");
  }
  std::printf("%s\n", j.str().c_str());
}

}  // namespace rag
