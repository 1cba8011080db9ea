#include "answer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "answer_report.h"
#include "conversation.h"
#include "corpus_db.h"
#include "kv_store.h"
#include "line_reader.h"
#include "printable.h"
#include "progress.h"
#include "store_settings.h"

namespace rag {
namespace {

using Clock = std::chrono::steady_clock;

// A chat's session holds the conversation: room for follow-ups beyond the
// first request (at most the model's context).
constexpr int kChatContextTokens = 4096;

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
  PrefillProgress* progress = nullptr;  // erased at the first token
  std::string text;
  Clock::time_point first_token;
  bool got_first = false;
};

int on_token(int32_t, const char* piece, size_t len, void* user) {
  auto* st = static_cast<StreamState*>(user);
  if (!st->got_first) {
    st->first_token = Clock::now();
    st->got_first = true;
    st->progress->clear();
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

int on_progress(cb_progress_stage stage, int32_t done, int32_t total, void* user) {
  static_cast<PrefillProgress*>(user)->update(stage, done, total);
  return 0;
}

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
    common_.kv = load_kv_settings(db_);
  }

  // The model and the chunk KV store; an ask that finds nothing relevant
  // (or only retrieves) never loads them.
  void load() {
    if (model_.h != nullptr) return;
    load_model(common_, model_);
    open_chunk_cache(common_, cache_);
    n_ctx_train_ = model_n_ctx_train(model_);
    // The store's system prompt, unless --system says otherwise for this
    // command: then every chunk misses (the library computes them, as in a
    // full prefill), said once.
    const std::string stored = store_system_prompt(db_);
    system_ = common_.system_prompt.value_or(stored);
    if (system_ != stored) warn(other_system_prompt_warning(common_.store, stored, system_));
    if (const auto w =
            other_model_warning(common_.store, db_.kv_models(),
                                model_identity(common_.model_path, model_), common_.model_path))
      warn(*w);
  }

  Retrieval retrieve(const std::string& question) {
    RetrievalOptions ro;
    ro.top_k = opts_.top_k;
    ro.min_relevance = opts_.min_relevance;
    ro.diverse = opts_.diversity;
    Retrieval found = rag::retrieve(db_, question, ro);
    for (const ChunkRecord& c : found.chunks) {
      std::error_code ec;
      if (std::filesystem::exists(c.path, ec) || !deleted_warned_.insert(c.path).second) continue;
      std::fprintf(stderr,
                   "rag_assistant: warning: %s was deleted after it was ingested and is still "
                   "answered from (run ingest with --prune)\n",
                   cbs::printable(c.display).c_str());
    }
    return found;
  }

  AnswerResult answer(const std::string& question, const std::vector<ChunkRecord>& sources,
                      bool stream, bool cancellable) {
    load();
    ensure_session(question, sources);
    std::vector<const char*> texts;
    for (const ChunkRecord& c : sources) texts.push_back(c.text.c_str());
    if (opts_.best_last) std::reverse(texts.begin(), texts.end());
    cb_rag_options ro = base_rag_options(system_);
    ro.mode = opts_.mode;
    if (opts_.ratio >= 0.0f) ro.ratio = opts_.ratio;
    ro.select = opts_.select;
    ro.auto_ratio = opts_.auto_ratio ? 1 : 0;
    if (opts_.chunk_shift >= 0) ro.chunk_shift = opts_.chunk_shift;

    AnswerResult r;
    r.sources = sources;
    cb_rag_stats_init(&r.rag);
    const std::vector<cb_tier_stats> before = tier_stats(cache_);
    check(cb_session_reset(session_.h), "cannot reset the session");
    cancellable_ = cancellable;
    const auto t0 = Clock::now();
    progress_.start();
    const cb_status s = cb_rag_prefill(session_.h, opts_.mode == CB_MODE_FULL ? nullptr : cache_.h,
                                       texts.data(), texts.size(), question.c_str(), &ro, &r.rag);
    progress_.clear();
    if (s == CB_ERR_CANCELLED) {
      r.cancelled = r.cancelled_in_prefill = true;
      r.prefill_ms = ms_between(t0, Clock::now());
      return r;
    }
    if (s == CB_ERR_CONTEXT_OVERFLOW)
      throw Error(std::string("the question and its documents do not fit the context: ") +
                  cb_last_error() + " (shorten the question or use a smaller --top-k)");
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
    generate(r, nullptr, 0, t0, t1, stream, cancellable);
    return r;
  }

  // The next turn of the conversation the session holds: `new_chunks`
  // (retrieved, not yet in the conversation) and the question appended as a
  // user turn; the earlier turns' KV is reused.  false when the turn does
  // not fit the session (nothing was changed: start the conversation again).
  bool follow_up(const std::string& question, const std::vector<const ChunkRecord*>& new_chunks,
                 bool stream, AnswerResult& r) {
    if (!frame_) frame_ = follow_up_frame(model_);
    std::vector<int32_t> prompt = special_tokens(frame_->close_and_open);
    const std::vector<int32_t> text = tokenize(model_, follow_up_text(new_chunks, question));
    prompt.insert(prompt.end(), text.begin(), text.end());
    const std::vector<int32_t> to_answer = special_tokens(frame_->to_answer);
    prompt.insert(prompt.end(), to_answer.begin(), to_answer.end());
    const int32_t n_past = cb_session_n_past(session_.h);
    if (n_past + static_cast<int>(prompt.size()) + opts_.max_tokens > cb_session_n_ctx(session_.h))
      return false;
    r = AnswerResult();
    for (const ChunkRecord* c : new_chunks) r.sources.push_back(*c);
    cb_rag_stats_init(&r.rag);
    r.rag.n_tokens = n_past + static_cast<int32_t>(prompt.size());
    r.rag.n_reused = n_past;
    r.rag.cache_misses = static_cast<int32_t>(new_chunks.size());
    cancellable_ = true;
    const auto t0 = Clock::now();
    progress_.start();
    generate(r, prompt.data(), prompt.size(), t0, t0, stream, true);
    return true;
  }

  // A storage tier that failed during the request (a server that went
  // away) costs time, never the answer: the chunks it could not serve were
  // computed.  Said on stderr, so the answer on stdout stays clean.
  static void warn_about_storage(const AnswerResult& r) {
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

  // Whether every content word of `text` is in some chunk (true for a text
  // of stopwords only).
  bool words_all_in_store(const std::string& text) {
    for (const std::string& word : content_words(text))
      if (db_.search(fts_match_query(word), 1).empty()) return false;
    return true;
  }

  // Sessions of at least n tokens (a chat's room for follow-ups).
  void set_min_context(int n) { min_ctx_ = n; }

  const char* mode_name() const { return cb_mode_name(opts_.mode); }
  bool tiered() const { return common_.tiers.any(); }
  int threads() const { return common_.threads; }

 private:
  // Generates the answer after `prompt` (none: from the RAG prefill's
  // logits), streamed when `stream`.
  void generate(AnswerResult& r, const int32_t* prompt, size_t n_prompt, Clock::time_point t0,
                Clock::time_point t1, bool stream, bool cancellable) {
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
    st.progress = &progress_;
    const cb_status g = cb_generate(session_.h, prompt, n_prompt, &go, on_token, &st, &gs);
    progress_.clear();
    if (g != CB_ERR_CANCELLED) check(g, "generation failed");
    r.cancelled = g == CB_ERR_CANCELLED;
    r.cancelled_in_prefill = r.cancelled && prompt != nullptr && !st.got_first;
    r.answer = st.text;
    r.n_generated = gs.n_generated;
    // A follow-up's prompt runs inside cb_generate: its prefill ends with
    // the first token.
    r.prefill_ms = prompt != nullptr ? gs.prefill_ms : ms_between(t0, t1);
    // TTFT as a user sees it: the request starts, the first token appears.
    r.ttft_ms = st.got_first ? ms_between(t0, st.first_token) : gs.ttft_ms;
  }

  std::vector<int32_t> special_tokens(const std::string& text) {
    size_t n = 0;
    check(cb_tokenize(model_.h, text.data(), text.size(), 0, 1, nullptr, 0, &n), "cannot tokenize");
    std::vector<int32_t> ids(n);
    if (n > 0)
      check(cb_tokenize(model_.h, text.data(), text.size(), 0, 1, ids.data(), ids.size(), &n),
            "cannot tokenize");
    return ids;
  }

  // A session large enough for this request (grown, never shrunk).  The
  // first one also runs a tiny untimed warm-up, so TTFT is that of a
  // running app and not of the first forward pass's page faults.
  void ensure_session(const std::string& question, const std::vector<ChunkRecord>& sources) {
    int need = static_cast<int>(tokenize(model_, question).size()) + 128 + opts_.max_tokens;
    for (const ChunkRecord& c : sources) need += c.n_tokens + 4;
    need = std::max(need, min_ctx_);
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
    check(cb_session_set_progress_callback(session_.h, on_progress, &progress_),
          "cannot set the progress callback");
  }

  CommonOptions common_;
  AskOptions opts_;
  CorpusDb db_;
  Model model_;
  ChunkCache cache_;
  Session session_;
  int n_ctx_train_ = 0;
  int min_ctx_ = 0;
  std::optional<FollowUpFrame> frame_;  // the template's turn boundaries, once needed
  std::string system_;                  // the requests' system prompt
  bool cancellable_ = false;            // read by on_abort
  PrefillProgress progress_;            // told by on_progress
  std::set<std::string> deleted_warned_;
};

}  // namespace

int run_ask(const CommonOptions& common, const AskOptions& opts, const std::string& question) {
  if (question.find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error("the question is empty");
  Assistant a(common, opts);
  const Retrieval found = a.retrieve(question);
  if (opts.retrieve_only) return report_retrieval(question, found, opts);
  if (!found.found) return report_not_found(question, found, opts);
  const std::vector<ChunkRecord>& sources = found.chunks;
  const AnswerResult r = a.answer(question, sources, !opts.json, false);
  if (opts.json)
    print_answer_json(question, found, r, opts, a.threads());
  else
    print_report(r, opts, a.mode_name(), a.tiered(), stdout);
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
  a.load();  // before the first question, so that it is answered at once
  a.set_min_context(kChatContextTokens);
  Conversation conversation;
  LineReader input(&g_interrupted);
  const bool tty = input.at_terminal();
  if (tty)
    std::fprintf(stderr,
                 "Ask about the documents in %s.  Follow-up questions continue the "
                 "conversation; /reset starts a new one, /sources lists the last answer's "
                 "sources.  Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the prompt (or 'quit') "
                 "exits.\n",
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
    if (line == "/reset") {
      conversation.clear();
      std::printf("(a new conversation)\n");
      std::fflush(stdout);
      continue;
    }
    if (line == "/sources") {
      print_sources(conversation.last_sources(), stdout);
      continue;
    }
    AnswerResult r;
    bool fresh = true;
    std::vector<ChunkRecord> retrieved;
    try {
      // In a conversation the previous question joins this one to rank the
      // chunks, so that "and the cat there?" finds what the conversation is
      // about, and to pass the floor: a follow-up leans on the
      // conversation for relevance, but never for words the documents lack
      // ("and its price?" about documents without prices is not found).
      const Retrieval found = a.retrieve(line);
      bool answerable = found.found;
      if (found.found) retrieved = found.chunks;
      if (conversation.live() && (found.found || a.words_all_in_store(line))) {
        const Retrieval joint = a.retrieve(retrieval_query(line, conversation.last_turn().first));
        if (joint.found) retrieved = joint.chunks;
        answerable = answerable || joint.found;
      }
      if (!answerable) {
        std::printf("%s\n(%s)\n", kNotFoundAnswer, not_found_detail(found, opts).c_str());
        std::fflush(stdout);
        continue;
      }
      if (conversation.live()) {
        fresh = !a.follow_up(line, conversation.new_chunks(retrieved), true, r);
        if (fresh)
          std::fprintf(stderr,
                       "rag_assistant: the conversation no longer fits the context; it goes on "
                       "from the last exchange\n");
      }
      if (fresh) {
        const std::string question =
            conversation.empty()
                ? line
                : question_with_last_exchange(conversation.last_turn().first,
                                              conversation.last_turn().second, line);
        r = a.answer(question, retrieved, true, true);
      }
      r.sources = retrieved;
    } catch (const std::runtime_error& e) {
      // One question that cannot be answered (too long for the context, a
      // failed read of the corpus) does not end the conversation.
      std::fflush(stdout);
      std::fprintf(stderr, "rag_assistant: error: %s\n", cbs::printable(e.what()).c_str());
      continue;
    }
    if (r.cancelled) g_interrupted = 0;  // that Ctrl-C was for the answer, not the program
    conversation.record(line, r.answer, retrieved, fresh, !r.cancelled_in_prefill);
    if (r.cancelled_in_prefill) {
      std::printf("[stopped after %.1f ms of reading the documents, before the answer]\n",
                  r.prefill_ms);
      std::fflush(stdout);
      continue;
    }
    if (r.cancelled) std::printf(" [stopped]");
    if (fresh)
      print_report(r, opts, a.mode_name(), a.tiered(), stdout);
    else
      print_follow_up_report(r, stdout);
  }
  return 0;
}

}  // namespace rag
