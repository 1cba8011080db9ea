#include "answer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "corpus_db.h"
#include "json_writer.h"
#include "line_reader.h"
#include "printable.h"
#include "store_settings.h"

namespace rag {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Set by SIGINT in chat; the session's abort callback (during the prefill)
// and the token callback (during the answer) turn it into a cancellation.
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) {
  g_interrupted = 1;
}

struct StreamState {
  bool stream = false;  // print each piece as it comes
  bool cancellable = false;
  std::string text;
  Clock::time_point first_token;
  bool got_first = false;
};

int on_token(int32_t, const char* piece, size_t len, void* user) {
  auto* st = static_cast<StreamState*>(user);
  if (!st->got_first) {
    st->first_token = Clock::now();
    st->got_first = true;
  }
  st->text.append(piece, len);
  if (st->stream) {
    std::fwrite(piece, 1, len, stdout);
    std::fflush(stdout);
  }
  return st->cancellable && g_interrupted ? 1 : 0;
}

// The session's abort callback; `user` points at whether this answer may be
// cancelled.
int on_abort(void* user) {
  return *static_cast<const bool*>(user) && g_interrupted ? 1 : 0;
}

struct Result {
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

// The loaded model, the store and a session sized for the requests; kept
// across the questions of a chat.
class Assistant {
 public:
  Assistant(const CommonOptions& common, const AskOptions& opts)
      : common_(common), opts_(opts), db_(corpus_db_path(common.store), false) {
    if (!db_.read_only_note().empty()) warn(db_.read_only_note());
    if (db_.n_chunks() == 0)
      throw Error("the store " + common.store +
                  " holds no documents: ingest some first ('rag_assistant --store DIR ingest "
                  "PATH...')");
    load_model(common, model_);
    open_chunk_cache(common, cache_);
    n_ctx_train_ = model_n_ctx_train(model_);
    // The store's system prompt, unless --system says otherwise for this
    // command: then every chunk misses (the library computes them, as in a
    // full prefill), said once.
    const std::string stored = store_system_prompt(db_);
    system_ = common.system_prompt.value_or(stored);
    if (system_ != stored) warn(other_system_prompt_warning(common.store, stored, system_));
    if (const auto w =
            other_model_warning(common.store, db_.kv_models(),
                                model_identity(common.model_path, model_), common.model_path))
      warn(*w);
  }

  std::vector<ChunkRecord> retrieve(const std::string& question) {
    std::vector<ChunkRecord> found = db_.search(fts_match_query(question), opts_.top_k);
    for (const ChunkRecord& c : found) {
      std::error_code ec;
      if (std::filesystem::exists(c.path, ec) || !deleted_warned_.insert(c.path).second) continue;
      std::fprintf(stderr,
                   "rag_assistant: warning: %s was deleted after it was ingested and is still "
                   "answered from (run ingest with --prune)\n",
                   cbs::printable(c.display).c_str());
    }
    return found;
  }

  Result answer(const std::string& question, const std::vector<ChunkRecord>& sources, bool stream,
                bool cancellable) {
    ensure_session(question, sources);
    std::vector<const char*> texts;
    for (const ChunkRecord& c : sources) texts.push_back(c.text.c_str());
    if (opts_.best_last) std::reverse(texts.begin(), texts.end());
    cb_rag_options ro = base_rag_options(system_);
    ro.mode = opts_.mode;
    if (opts_.ratio >= 0.0f) ro.ratio = opts_.ratio;
    ro.select = opts_.select;
    ro.auto_ratio = opts_.auto_ratio ? 1 : 0;

    Result r;
    r.sources = sources;
    cb_rag_stats_init(&r.rag);
    const std::vector<cb_tier_stats> before = tier_stats(cache_);
    check(cb_session_reset(session_.h), "cannot reset the session");
    cancellable_ = cancellable;
    const auto t0 = Clock::now();
    const cb_status s = cb_rag_prefill(session_.h, opts_.mode == CB_MODE_FULL ? nullptr : cache_.h,
                                       texts.data(), texts.size(), question.c_str(), &ro, &r.rag);
    if (s == CB_ERR_CANCELLED) {
      r.cancelled = r.cancelled_in_prefill = true;
      r.prefill_ms = ms_between(t0, Clock::now());
      return r;
    }
    if (s == CB_ERR_CONTEXT_OVERFLOW)
      throw Error(std::string("the question and its documents do not fit the context: ") +
                  cb_last_error() + " (use a smaller --top-k)");
    check(s, std::string("RAG prefill (") + cb_mode_name(opts_.mode) + ") failed");
    const auto t1 = Clock::now();
    r.tiers = tier_stats(cache_);
    for (size_t i = 0; i < r.tiers.size() && i < before.size(); ++i) {
      cb_tier_stats& t = r.tiers[i];
      const cb_tier_stats& b = before[i];
      t.hits -= b.hits;
      t.misses -= b.misses;
      t.bytes_read -= b.bytes_read;
      t.read_failures -= b.read_failures;
      t.placed -= b.placed;
      t.promoted_in -= b.promoted_in;
      t.demoted_in -= b.demoted_in;
      t.failures -= b.failures;
    }
    warn_about_storage(r);

    cb_sampling_options so;
    cb_sampling_options_init(&so);
    so.temperature = opts_.temperature;
    so.min_p = opts_.min_p;
    so.repeat_penalty = opts_.repeat_penalty;
    if (opts_.repeat_last_n >= 0) so.repeat_last_n = opts_.repeat_last_n;
    so.seed = opts_.seed;
    std::vector<const char*> stops;
    for (const std::string& stop : opts_.stops) stops.push_back(stop.c_str());
    cb_generate_options go;
    cb_generate_options_init(&go);
    go.max_tokens = opts_.max_tokens;
    go.sampling = &so;
    go.stop_strings = stops.data();
    go.n_stop_strings = stops.size();
    cb_generate_stats gs;
    cb_generate_stats_init(&gs);
    StreamState st;
    st.stream = stream;
    st.cancellable = cancellable;
    const cb_status g = cb_generate(session_.h, nullptr, 0, &go, on_token, &st, &gs);
    if (g != CB_ERR_CANCELLED) check(g, "generation failed");
    r.cancelled = g == CB_ERR_CANCELLED;
    r.answer = st.text;
    r.n_generated = gs.n_generated;
    r.prefill_ms = ms_between(t0, t1);
    // TTFT as a user sees it: the request starts, the first token appears.
    r.ttft_ms = st.got_first ? ms_between(t0, st.first_token) : gs.ttft_ms;
    return r;
  }

  // A storage tier that failed during the request (a server that went
  // away) costs time, never the answer: the chunks it could not serve were
  // computed.  Said on stderr, so the answer on stdout stays clean.
  static void warn_about_storage(const Result& r) {
    for (const cb_tier_stats& t : r.tiers)
      if (t.failures > 0 || t.read_failures > 0)
        std::fprintf(stderr,
                     "rag_assistant: warning: storage tier '%s' failed during this question "
                     "(%llu failed lookup(s) or store(s), %llu failed read(s)); its chunks were "
                     "computed instead\n",
                     t.name, static_cast<unsigned long long>(t.failures),
                     static_cast<unsigned long long>(t.read_failures));
    if (r.rag.chunks_recomputed > 0)
      std::fprintf(stderr,
                   "rag_assistant: warning: %d cached chunk(s) could not be read and were "
                   "computed%s\n",
                   r.rag.chunks_recomputed,
                   r.rag.cache_hits == 0 ? " (the request was a full prefill)" : "");
  }

  const char* mode_name() const { return cb_mode_name(opts_.mode); }
  bool tiered() const { return common_.tiers.any(); }
  int threads() const { return common_.threads; }

 private:
  // A session large enough for this request (grown, never shrunk).  The
  // first one also runs a tiny untimed warm-up, so TTFT is that of a
  // running app and not of the first forward pass's page faults.
  void ensure_session(const std::string& question, const std::vector<ChunkRecord>& sources) {
    int need = static_cast<int>(tokenize(model_, question).size()) + 128 + opts_.max_tokens;
    for (const ChunkRecord& c : sources) need += c.n_tokens + 4;
    if (need > n_ctx_train_) need = n_ctx_train_;  // cb_rag_prefill reports what overflows
    if (session_.h != nullptr && cb_session_n_ctx(session_.h) >= need) return;
    Session fresh;
    create_session(model_, common_, std::max(need, 512), fresh);
    std::swap(session_.h, fresh.h);
    const std::vector<int32_t> warm = tokenize(model_, "Warm-up.");
    check(cb_session_prefill(session_.h, warm.data(), warm.size()), "warm-up failed");
    check(cb_session_reset(session_.h), "cannot reset the session");
    check(cb_session_set_abort_callback(session_.h, on_abort, &cancellable_),
          "cannot set the abort callback");
  }

  CommonOptions common_;
  AskOptions opts_;
  CorpusDb db_;
  Model model_;
  ChunkCache cache_;
  Session session_;
  int n_ctx_train_ = 0;
  std::string system_;        // the requests' system prompt
  bool cancellable_ = false;  // read by on_abort
  std::set<std::string> deleted_warned_;
};

std::string ratio_text(const Result& r, const AskOptions& o) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f%s", static_cast<double>(r.rag.ratio),
                o.auto_ratio && o.mode == CB_MODE_BLEND ? " (auto)" : "");
  return buf;
}

void print_report(const Result& r, const AskOptions& o, const char* mode, bool tiered, FILE* out) {
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
  std::fprintf(out, "sources:");
  for (size_t i = 0; i < r.sources.size(); ++i)
    std::fprintf(out, "%s [%zu] %s #%d", i ? "," : "", i + 1,
                 cbs::printable(r.sources[i].display).c_str(), r.sources[i].index);
  std::fprintf(out, "\n");
  std::fflush(out);
}

std::string no_hits_message(const std::string& question) {
  return "no document in the store matches the question \"" + question + "\" (try other words)";
}

}  // namespace

int run_ask(const CommonOptions& common, const AskOptions& opts, const std::string& question) {
  if (question.find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error("the question is empty");
  Assistant a(common, opts);
  const std::vector<ChunkRecord> sources = a.retrieve(question);
  if (sources.empty()) throw Error(no_hits_message(question));
  const Result r = a.answer(question, sources, !opts.json, false);
  if (opts.json) {
    std::vector<cbs::JsonObject> src;
    for (const ChunkRecord& c : r.sources) {
      cbs::JsonObject s;
      s.add("id", c.id)
          .add("file", c.display)
          .add("chunk", static_cast<int64_t>(c.index))
          .add("title", c.title)
          .add("bm25", c.score);
      src.push_back(std::move(s));
    }
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
    cbs::JsonObject o;
    o.add("question", question)
        .add("answer", r.answer)
        .add("ttft_ms", r.ttft_ms)
        .add("prefill_ms", r.prefill_ms)
        .add("ratio", std::round(static_cast<double>(r.rag.ratio) * 1e6) / 1e6)
        .add("ratio_mode", opts.auto_ratio ? "auto" : "fixed")
        .add("select", opts.mode == CB_MODE_BLEND ? cb_select_name(opts.select) : "none")
        .add("context_order", opts.best_last ? "best-last" : "best-first")
        .add("mode", a.mode_name())
        .add("sources", src)
        .add("cache_hits", r.rag.cache_hits)
        .add("cache_misses", r.rag.cache_misses)
        .add("chunks_recomputed", r.rag.chunks_recomputed)
        .add("tiers", tiers)
        .add("n_ctx", r.rag.n_tokens)
        .add("n_reused", r.rag.n_reused)
        .add("computed_fraction", r.rag.computed_fraction)
        .add("n_generated", static_cast<int64_t>(r.n_generated))
        .add("threads", static_cast<int64_t>(a.threads()));
    std::printf("%s\n", o.str().c_str());
  } else {
    print_report(r, opts, a.mode_name(), a.tiered(), stdout);
  }
  return 0;
}

int run_chat(const CommonOptions& common, const AskOptions& opts) {
  // Installed before the model loads, so an early Ctrl-C never kills the
  // process half-way.  No SA_RESTART: Ctrl-C at the prompt interrupts the
  // blocking read, which is how the loop learns to exit.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  Assistant a(common, opts);
  LineReader input(&g_interrupted);
  const bool tty = input.at_terminal();
  if (tty)
    std::fprintf(stderr,
                 "Ask about the documents in %s.  Ctrl-C stops an answer; Ctrl-C or Ctrl-D at "
                 "the prompt (or 'quit') exits.\n",
                 common.store.c_str());
  std::string line;
  for (;;) {
    if (g_interrupted) break;  // Ctrl-C while loading or between answers
    if (!input.read(line)) {
      if (tty) std::fprintf(stderr, "\n");
      break;  // EOF, or Ctrl-C at the prompt
    }
    g_interrupted = 0;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line == "quit" || line == "exit") break;
    Result r;
    try {
      const std::vector<ChunkRecord> sources = a.retrieve(line);
      if (sources.empty()) {
        std::printf("(%s)\n", no_hits_message(line).c_str());
        std::fflush(stdout);
        continue;
      }
      r = a.answer(line, sources, true, true);
    } catch (const std::runtime_error& e) {
      // One question that cannot be answered (too long for the context, a
      // failed read of the corpus) does not end the conversation.
      std::fflush(stdout);
      std::fprintf(stderr, "rag_assistant: error: %s\n", cbs::printable(e.what()).c_str());
      continue;
    }
    if (r.cancelled) g_interrupted = 0;  // that Ctrl-C was for the answer, not the program
    if (r.cancelled_in_prefill) {
      std::printf("[stopped after %.1f ms of reading the documents, before the answer]\n",
                  r.prefill_ms);
      std::fflush(stdout);
      continue;
    }
    if (r.cancelled) std::printf(" [stopped]");
    print_report(r, opts, a.mode_name(), a.tiered(), stdout);
  }
  return 0;
}

}  // namespace rag
